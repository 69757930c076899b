"""The benchmarks' load generator, in a process of its own: an aiohttp client with keep-alive
connections, every loop bounded in count and time. Prints one JSON line of results.

    python bench/_load.py rate <lifetime seconds>
        reads windows from stdin (``rate_commands``): POST /run from <concurrency> workers,
        1 request in 20 failing (5 %; a window may say 1 in N, 1 for all, 0 for none); latency
        of each request after the warm-up; every failing reply checked for its report.
    python bench/_load.py hold <port> <in flight> <max seconds> <failing: 0 or 1>
        <in flight> requests to POST /hold, all open at once (with <failing>, 5 % of them fail
        once released), then POST /release and every reply read.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from typing import Any

import aiohttp
import orjson

REPORT = "X-NG-Failure-Report"
FAIL_EVERY = 20  # 5 % of requests fail
STEP = 2048  # connections opened at once when holding requests: within the listen backlog (4096)


def body(task_id: int, fail: bool) -> bytes:
    """About 2 KB of JSON, as a Gym /run request."""
    turns = [
        {"role": "system", "content": "You are a careful assistant. Answer with a single number. " * 5},
        {"role": "user", "content": f"Task {task_id}: what is the sum of the first 100 odd numbers? " * 9},
        {"role": "assistant", "content": "Let me work through it step by step before answering. " * 10},
        {"role": "user", "content": "Show the final answer only, formatted as an integer. " * 7},
    ]
    payload = {
        "task_id": task_id,
        "fail": fail,
        "model": "policy-model",
        "temperature": 0.7,
        "max_output_tokens": 512,
        "input": turns,
        "metadata": {"env": "math", "split": "train", "attempt": "1", "rollout": f"r-{task_id}"},
    }
    return orjson.dumps(payload)


HEALTHY, FAILING = body(1, False), body(2, True)
HEADERS = {"content-type": "application/json"}


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


async def rate(
    session: aiohttp.ClientSession,
    port: int,
    concurrency: int,
    limit: int,
    seconds: float,
    warmup: float,
    fail_every: int = FAIL_EVERY,
) -> dict[str, Any]:
    """Throughput is each worker's requests issued in the measured window (after the warm-up,
    until ``seconds`` passed or ``limit`` requests were issued) over the time from its first
    one's start to its last one's reply, summed over workers. Replies come in waves as long as
    the concurrency (each request holds a second one on the same server), so a count of the
    replies inside a fixed window moves by a whole wave: 299 and 396 req/s in neighbouring
    rounds of one server. That count is ``rps_window``. Latency is that of the requests issued
    in the window."""
    url = f"http://127.0.0.1:{port}/run"
    latencies: list[float] = []
    stats = {"failing": 0, "failing_with_report": 0, "healthy_with_report": 0, "errors": 0, "bad_status": 0}
    issued = completed = total = 0
    window_start = time.perf_counter() + warmup
    window_end = window_start + seconds
    rates: list[float] = []  # per worker: its measured requests per second

    async def worker() -> None:
        nonlocal issued, completed, total, window_end
        sent = 0
        first_begin = last_done = None
        measured_here = 0
        while True:
            begin = time.perf_counter()
            if begin >= window_end:
                if first_begin is not None and last_done is not None and last_done > first_begin:
                    rates.append(measured_here / (last_done - first_begin))
                return
            counted = begin >= window_start
            if counted:
                issued += 1
                if issued >= limit:
                    window_end = begin  # the count bound reached: the window closes here
            sent += 1
            fail = fail_every > 0 and (issued if counted else sent) % fail_every == 0
            try:
                async with session.post(url, data=FAILING if fail else HEALTHY, headers=HEADERS) as reply:
                    await reply.read()
                    status, has_report = reply.status, REPORT in reply.headers
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                stats["errors"] += 1
                continue
            done = time.perf_counter()
            total += 1
            if window_start <= done <= window_end:
                completed += 1
            if not counted:
                continue
            if first_begin is None:
                first_begin = begin
            last_done, measured_here = done, measured_here + 1
            latencies.append(done - begin)
            if fail:
                stats["failing"] += 1
                stats["failing_with_report"] += has_report
                stats["bad_status"] += status != 500
            else:
                stats["healthy_with_report"] += has_report
                stats["bad_status"] += status != 200

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    latencies.sort()
    measured = window_end - window_start
    return {
        "requests": len(latencies),
        "replies": total,  # warm-up and drain included: what the server did while this ran
        "seconds": measured,
        "rps": sum(rates),
        "rps_window": completed / measured,
        "p50": percentile(latencies, 0.50),
        "p99": percentile(latencies, 0.99),
        **stats,
    }


async def rate_commands(lifetime: float) -> None:
    """One window per line read from stdin, ``<port> <concurrency> <max requests> <seconds>
    <warm-up seconds> [<1 in N failing>]``, one JSON line of results printed per window; keep-alive connections
    are kept per server until the concurrency changes. Ends at end of input or ``lifetime``."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + lifetime
    sessions: dict[int, aiohttp.ClientSession] = {}
    current = 0
    try:
        while time.monotonic() < deadline:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line.strip():
                return
            port, concurrency, limit = map(int, line.split()[:3])
            seconds, warmup = map(float, line.split()[3:5])
            fail_every = int(line.split()[5]) if len(line.split()) > 5 else FAIL_EVERY
            if concurrency != current:
                for session in sessions.values():
                    await session.close()
                sessions, current = {}, concurrency
            if port not in sessions:
                connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0, keepalive_timeout=3600)
                sessions[port] = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120))
            result = await rate(sessions[port], port, concurrency, limit, seconds, warmup, fail_every)
            print(json.dumps(result), flush=True)
    finally:
        for session in sessions.values():
            await session.close()


async def hold(port: int, count: int, seconds: float, failing: bool) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=600)
    timeout = aiohttp.ClientTimeout(total=seconds, sock_connect=30)
    stats = {"ok": 0, "failing": 0, "failing_with_report": 0, "errors": 0}

    async def one(session: aiohttp.ClientSession, index: int) -> None:
        fail = failing and index % FAIL_EVERY == 0
        try:
            async with session.post(f"{base}/hold", data=FAILING if fail else HEALTHY, headers=HEADERS) as reply:
                await reply.read()
                if fail:
                    stats["failing"] += 1
                    stats["failing_with_report"] += REPORT in reply.headers
                else:
                    stats["ok"] += reply.status == 200
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            stats["errors"] += 1

    async def held(control: aiohttp.ClientSession) -> int:
        async with control.get(f"{base}/held") as reply:
            return int((await reply.json())["held"])

    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as control,
    ):
        tasks: list[asyncio.Task[None]] = []
        # Open connections in steps the listen backlog can take, each step waited for.
        for first in range(0, count, STEP):
            tasks += [asyncio.create_task(one(session, i)) for i in range(first, min(count, first + STEP))]
            while await held(control) < len(tasks) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        in_flight = await held(control)
        async with control.post(f"{base}/release") as reply:
            await reply.read()
        await asyncio.wait(tasks, timeout=max(1.0, deadline - time.monotonic()))
        for task in tasks:
            task.cancel()
    return {"in_flight": in_flight, **stats}


def main() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    mode = sys.argv[1]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    if mode == "rate":
        runner(rate_commands(lifetime=float(sys.argv[2])))
    else:
        result = runner(hold(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
