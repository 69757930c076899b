"""The failing request's CPU as instructions, which no other process on the machine changes:
each server of ``failing_path.py`` (plain A, ng_otel B, the hand-written minimum) under
``valgrind --tool=callgrind``, one failing request at a time (the stock-Gym chain: a dropped
attempt, the model's failure, the agent's two events), every instruction of every thread from
the first measured request to the last counted.

Time-based figures on a shared two-core machine move by several per cent from run to run;
this one repeats to 0.1 %. The span processor and the metric reader wait until the count is
taken (their delays, and the span batch, are set past it), so it is the request path:
recording, links, headers, the failure log, the link index, the span processor's queue, the
garbage collector. Export is left to ``failing_path.py``, which measures it in time with the
rest.

No target of its own: it says how much of B's difference from the minimum is the request path.
Needs valgrind (Debian's ``valgrind``). ``--healthy`` counts healthy requests instead, B against A.
Run: .venv/bin/python bench/instructions.py [--requests 100] [--healthy]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import body
from _procs import otlp_sink, servers
from failing_path import VARIANTS, Client, env

WARMUP_REQUESTS = 30
# A full batch is exported at once, whatever the delay: the batch as large as the queue
# (failing_path.py's 65,536), so no export falls inside the count, where a window of 100
# requests held one or two of them by chance (about 3 M instructions a request either way).
NOT_WITHIN_THE_COUNT = {
    "OTEL_BSP_SCHEDULE_DELAY": "600000",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "65536",
    "OTEL_METRIC_EXPORT_INTERVAL": "600000",
}
TOTALS = re.compile(r"^(?:summary|totals): (\d+)", re.MULTILINE)


def instructions_per_request(out: Path, pid: int, client: Client, requests: int, *, fail: bool = True) -> float:
    payload = body(7, fail)
    for _ in range(WARMUP_REQUESTS):
        client.post(payload)
    subprocess.run(["callgrind_control", "--zero", str(pid)], check=True, capture_output=True, timeout=120)
    for _ in range(requests):
        client.post(payload)
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True, timeout=120)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dumps = list(out.parent.glob(f"{out.name}.{pid}.1"))
        if dumps and (found := TOTALS.search(dumps[0].read_text(errors="replace"))):
            return int(found.group(1)) / requests
        time.sleep(0.5)
    raise RuntimeError(f"callgrind wrote no count for {pid}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--healthy", action="store_true", help="count healthy requests instead (no target)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("instructions: valgrind is not installed (apt-get install valgrind): nothing measured")
        return
    mix = "healthy" if args.healthy else "failing"
    print(
        f"instructions: each server under callgrind, {args.requests} {mix} requests one at a time, "
        "export and metric collection after the count",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as folder, otlp_sink() as (endpoint, _):
        out = Path(folder) / "callgrind.out"
        prefix = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p")
        quiet = {**env(endpoint), **NOT_WITHIN_THE_COUNT, "PYTHONHASHSEED": "0"}
        with servers({name: (name, quiet) for name in VARIANTS}, prefix=prefix, ready_within=600) as running:
            counts = {
                name: instructions_per_request(
                    out, server.pid, Client(server.port), args.requests, fail=not args.healthy
                )
                for name, server in running.items()
            }
    for name, count in counts.items():
        print(f"  {VARIANTS[name]}: {count / 1e6:.3f} M instructions per {mix} request")
    if args.healthy:  # the issue asks the healthy path to stay free: B against A
        print(f"healthy-request instructions B/A: {counts['ng_otel'] / counts['plain']:.3f} (no target of its own)")
        return
    ratio = counts["ng_otel"] / counts["minimum"]
    extra = (counts["ng_otel"] - counts["plain"]) / (counts["minimum"] - counts["plain"])
    print(
        f"failing-request instructions B / minimum: {ratio:.3f} (no target of its own: the request "
        f"path's share of failing_path.py's figures); B's above A's / the minimum's above A's: {extra:.2f}"
    )


if __name__ == "__main__":
    main()
