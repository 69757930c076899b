"""Where B's request path spends time beyond A's: py-spy samples each server of the throughput
benchmark (plain and ng_otel) under the same load, alternately, then prints the share of B's
samples under ng_otel's frames, the ng_otel functions they are in, and the same for the
frames both servers share, A beside B.

py-spy must be installed (``pip install py-spy``; it is in the ``bench`` extra) and allowed to
ptrace its siblings. Not part of ``make bench``: a profile is evidence, not a figure.
With ``--variants ng_otel,minimum --fail-every 1`` it compares ng_otel with the hand-written
minimum on failing requests only (``failing_path.py``'s difference).
Run: .venv/bin/python bench/profile_path.py [seconds per server, default 20] [--out DIR]
     [--variants plain,ng_otel] [--fail-every 20] [--concurrency 256]
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _procs import load_generator, otlp_sink, servers
from throughput import telemetry_env

FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def record(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    command = [py_spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "250", "-f", "raw", "-o", str(out)]
    # --gil: only the thread holding the GIL is sampled, so shares are shares of the CPU the
    # interpreter got, whichever thread (the event loop, the span exporter) used it.
    return subprocess.Popen(
        [*command, "--full-filenames", "--gil"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


Frame = tuple[str, str]  # (function, file:line)


def stacks(path: Path) -> list[tuple[list[Frame], int]]:
    """Collapsed stacks, root first."""
    result = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = []
        for text in stack.split(";"):
            match = FRAME.match(text)
            frames.append((match["function"], f"{match['file']}:{match['line']}") if match else (text, ""))
        result.append((frames, int(count)))
    return result


# Frames ng_otel passes through (the app it wraps, the server and instrumentation around it):
# time below them is the app's, not ng_otel's.
PASS_THROUGH = ("/starlette/", "/fastapi/", "/uvicorn/", "/opentelemetry/instrumentation/", "_gym_app.py", "/asyncio/")


def is_ours(frame: Frame) -> bool:
    return "/ng_otel/" in frame[1] and "/bench/" not in frame[1]


def short(frame: Frame) -> str:
    where = frame[1]
    for marker in ("/ng_otel/", "/site-packages/", "/lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    return f"{frame[0]} ({where})"


def summarize(name: str, samples: list[tuple[list[Frame], int]]) -> dict[str, int]:
    """Samples of the event loop's thread (others are the exporters'); those spent in ng_otel's
    own work: the deepest ng_otel frame calls nothing it passes through. Attributed to the
    ng_otel function the request path entered (after the last pass-through frame) and to the
    deepest one."""
    loop = [(frames, count) for frames, count in samples if frames and "_gym_app.py" in frames[0][1]]
    total = sum(count for _, count in loop)
    others = sum(count for _, count in samples) - total
    entries: collections.Counter[str] = collections.Counter()
    deepest: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for frames, count in loop:
        for key in {short(frame) for frame in frames}:
            inclusive[key] += count
        ours = [index for index, frame in enumerate(frames) if is_ours(frame)]
        if not ours or any(any(p in f[1] for p in PASS_THROUGH) for f in frames[ours[-1] + 1 :]):
            continue
        entry = ours[-1]
        while entry > 0 and not any(p in frames[entry - 1][1] for p in PASS_THROUGH):
            entry -= 1
        entries[short(frames[entry]).rsplit(":", 1)[0] + ")"] += count
        deepest[short(frames[ours[-1]])] += count
    own = sum(entries.values())
    print(
        f"{name}: {total} samples holding the GIL on the event loop's thread, {others} on others (exporters); "
        f"in ng_otel's own work: {own} ({own / max(total, 1):.1%})"
    )
    print("  by the ng_otel function the request path entered:")
    for key, count in entries.most_common(10):
        print(f"    {count / total:6.2%}  {key}")
    print("  by the deepest ng_otel frame (itself and what it calls):")
    for key, count in deepest.most_common(15):
        print(f"    {count / total:6.2%}  {key}")
    return {key: count * 10_000 // max(total, 1) for key, count in inclusive.items()}  # basis points


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seconds", nargs="?", type=float, default=20)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--variants", default="plain,ng_otel", help="two of plain, ng_otel, minimum: base first")
    parser.add_argument("--fail-every", type=int, default=20, help="1 request in N fails (1: all, 0: none)")
    args = parser.parse_args()
    base, ours = args.variants.split(",")
    out = args.out or Path(tempfile.mkdtemp(prefix="ng-otel-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    with otlp_sink() as (endpoint, _):
        env = telemetry_env("otlp", endpoint)
        specs = {base: (base, env), ours: (ours, env)}
        with servers(specs) as running, load_generator() as generator:
            for name in running:  # warm up
                generator.window(running[name].port, args.concurrency, 10**6, 2, 0.5, args.fail_every)
            for name in running:
                profiler = record(running[name].pid, args.seconds, out / f"{name}.txt")
                try:
                    seconds = args.seconds + 2
                    port = running[name].port
                    result = generator.window(port, args.concurrency, 10**7, seconds, 0.5, args.fail_every)
                finally:
                    profiler.wait(timeout=args.seconds + 60)
                print(f"{name}: {result['rps']:,.0f} req/s while sampled")
    shares = {name: summarize(name, stacks(out / f"{name}.txt")) for name in (base, ours)}
    print(f"inclusive share of the event loop's samples, {base} -> {ours}, basis points, the 25 that grew most:")
    keys = set(shares[base]) | set(shares[ours])
    grown = sorted(keys, key=lambda k: shares[ours].get(k, 0) - shares[base].get(k, 0), reverse=True)
    for key in grown[:25]:
        print(f"    {shares[base].get(key, 0):5d} -> {shares[ours].get(key, 0):5d}  {key}")
    print(f"raw stacks: {out}")


if __name__ == "__main__":
    main()
