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

``--concurrency N`` counts throughput.py's mix instead (1 request in 20 failing) with N in
flight, per request on average: one at a time a request's objects are gone before the garbage
collector looks, with 256 in flight they live through its collections and reach the oldest
generation, whose full collections are most of its cost (docs/performance.md, 6 December
2026). Full collections come a few per thousand requests, so counts of 1,280 requests move by
one of them (~1 %) from run to run; not part of ``make bench`` (about a minute per server).
Run: .venv/bin/python bench/instructions.py [--requests 100] [--healthy] [--concurrency 256]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
from _load import FAIL_EVERY, FAILING, HEADERS, HEALTHY, body
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


def instructions_per_request(
    out: Path, pid: int, send: Callable[[int], None], requests: int, warmup: int = WARMUP_REQUESTS
) -> float:
    """Instructions of the server ``pid`` per request while ``send(count)`` makes ``count`` of them."""
    send(warmup)
    subprocess.run(["callgrind_control", "--zero", str(pid)], check=True, capture_output=True, timeout=120)
    send(requests)
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True, timeout=120)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dumps = list(out.parent.glob(f"{out.name}.{pid}.1"))
        if dumps and (found := TOTALS.search(dumps[0].read_text(errors="replace"))):
            return int(found.group(1)) / requests
        time.sleep(0.5)
    raise RuntimeError(f"callgrind wrote no count for {pid}")


def one_at_a_time(port: int, fail: bool) -> Callable[[int], None]:
    client, payload = Client(port), body(7, fail)

    def send(count: int) -> None:
        for _ in range(count):
            client.post(payload)

    return send


def in_flight(port: int, concurrency: int) -> Callable[[int], None]:
    """``count`` requests of throughput.py's mix, ``concurrency`` of them in flight at once."""
    url = f"http://127.0.0.1:{port}/run"

    async def requests(count: int) -> None:
        sent = 0
        timeout = aiohttp.ClientTimeout(total=3600)  # under callgrind a request waits its turn for minutes
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:

            async def worker() -> None:
                nonlocal sent
                while sent < count:  # bounded: each worker stops once `count` were sent
                    sent += 1
                    fail = sent % FAIL_EVERY == 0
                    async with session.post(url, data=FAILING if fail else HEALTHY, headers=HEADERS) as reply:
                        await reply.read()
                        if reply.status != (500 if fail else 200):
                            raise RuntimeError(f"unexpected status {reply.status}")

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    return lambda count: asyncio.run(requests(count))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--healthy", action="store_true", help="count healthy requests instead (no target)")
    parser.add_argument("--concurrency", type=int, default=0, help="throughput.py's mix, this many in flight")
    args = parser.parse_args(argv)
    if args.concurrency:
        args.requests = max(args.requests, 5 * args.concurrency)  # several waves, several full collections
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("instructions: valgrind is not installed (apt-get install valgrind): nothing measured")
        return
    mix = "healthy" if args.healthy else "failing"
    if args.concurrency:
        mix = f"mixed (1 in {FAIL_EVERY} failing)"
    how = f"{args.concurrency} in flight" if args.concurrency else "one at a time"
    print(
        f"instructions: each server under callgrind, {args.requests} {mix} requests {how}, "
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
                    out,
                    server.pid,
                    in_flight(server.port, args.concurrency)
                    if args.concurrency
                    else one_at_a_time(server.port, not args.healthy),
                    args.requests,
                    max(WARMUP_REQUESTS, 2 * args.concurrency),
                )
                for name, server in running.items()
            }
    for name, count in counts.items():
        print(f"  {VARIANTS[name]}: {count / 1e6:.3f} M instructions per {mix} request")
    if args.concurrency:
        print(
            f"instructions per request at concurrency {args.concurrency}, 5 % failing: "
            f"B/A {counts['ng_otel'] / counts['plain']:.3f}, minimum/A {counts['minimum'] / counts['plain']:.3f} "
            "(no target of its own: the instructions behind throughput.py's CPU per reply)"
        )
        return
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
