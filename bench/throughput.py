"""Throughput and tail latency where NeMo Gym runs: uvicorn on uvloop and httptools, many
requests in flight, the same FastAPI app (OpenTelemetry tracing and metrics) plain (A), with
ng_otel (B), with ng_otel switched off (``NG_OTEL_ENABLED=0``) and with the hand-written
minimum of the failing path (``_gym_minimum.py``), each server in its own process; ~2 KB JSON
in and out, each request calling the app's model over aiohttp with the trace context
(``_gym_app.py``), 5 % of requests failing the stock-Gym way: a retried attempt that found the
model unreachable, the model's failure, and a three-event cause chain linked to the model's
span.

A load generator in its own process (aiohttp, keep-alive) drives one server at a time at
concurrency 256 and 1,024; the servers alternate over several rounds, and every figure is a
ratio of neighbours in one round (median, and the range over rounds in brackets). The rounds
are spread over fresh sets of server processes (``--launches``), since two processes of the
same code differ by several per cent here (``failing_path.py`` says why). Requests/s
is each worker's requests over the time they took, summed (``_load.rate``): replies come in
waves, and a count of replies in a fixed window moves by a whole wave.

Targets: requests/s B / minimum >= 0.97 at both concurrencies (the minimum does the failing
path's contract duties with the bare SDK; the plain app does none of them, so B/A is printed
beside it for scale, with no target); p99 B/A <= 1.05; switched off, indistinguishable from
plain (the range of off/A over rounds includes 1.00, or the median is within 1 %). Every
failing reply of B carries X-NG-Failure-Report.
Exporters: OTLP/HTTP to ng_otel's receiver in its own process on 127.0.0.1 (a sink: it keeps
nothing), the same for every server; ``--exporter none`` sets OTEL_*_EXPORTER=none instead.
Run: .venv/bin/python bench/throughput.py [--launches 2] [--rounds 5] [--seconds 2.5] [--exporter otlp|none]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _procs import LoadGenerator, Server, cpu_seconds, load_generator, otlp_sink, servers, turn_order

CONCURRENCIES = (256, 1024)
WARMUP = 0.5  # seconds of load before each measured window, at concurrency 256
DRAIN = 0.4  # seconds after a window for the span processor to export what it queued
EXPORT_WITHIN_DRAIN = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # so a window pays for its own export


# Every request holds a second one (its model call) on the same server, so requests move in
# waves as long as the concurrency: at 1,024 the first replies of a fresh window come seconds
# in. Windows and warm-ups grow with the concurrency so each spans several waves.
def scaled(seconds: float, concurrency: int) -> float:
    return seconds * max(1.0, concurrency / 256)


MAX_REQUESTS = 200_000  # the count bound of one measured window (the time bound ends it first)


def telemetry_env(exporter: str, endpoint: str | None) -> dict[str, str]:
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": exporter,
        "OTEL_METRICS_EXPORTER": exporter,
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_METRIC_EXPORT_INTERVAL": "5000",
    }
    env.pop("NG_OTEL_ENABLED", None)
    if endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    return env


def server_specs(env: dict[str, str]) -> dict[str, tuple[str, dict[str, str]]]:
    return {
        "plain": ("plain", env),
        "ng_otel": ("ng_otel", env),
        "off": ("off", {**env, "NG_OTEL_ENABLED": "0"}),
        "minimum": ("minimum", env),
    }


def span(values: list[float]) -> str:
    return f"[{min(values):.3f}-{max(values):.3f}]"


def measure(args: argparse.Namespace, sink_pid: int | None, env: dict[str, str]) -> dict[int, list[dict[str, Any]]]:
    """Per concurrency, one dict per round: variant -> the load generator's result."""
    results: dict[int, list[dict[str, Any]]] = {concurrency: [] for concurrency in CONCURRENCIES}
    for _ in range(args.launches):
        with servers(server_specs(env)) as running, load_generator() as generator:
            measure_launch(args, sink_pid, running, generator, results)
    return results


def measure_launch(
    args: argparse.Namespace,
    sink_pid: int | None,
    running: dict[str, Server],
    generator: LoadGenerator,
    results: dict[int, list[dict[str, Any]]],
) -> None:
    """One launch's rounds at each concurrency, appended to ``results``."""
    names = list(running)
    for concurrency in CONCURRENCIES:
        first = len(results[concurrency]) + 1  # rounds are numbered on across launches, and set the order
        for index in range(first - 1, first + args.rounds):  # the first warms every server up, unrecorded
            order = turn_order(names, index)
            round_: dict[str, Any] = {}
            for name in order:
                pid = running[name].pid
                gc_before = running[name].gc_seconds()
                start = time.monotonic(), cpu_seconds(pid), cpu_seconds(sink_pid) if sink_pid else 0.0
                seconds, warmup = scaled(args.seconds, concurrency), scaled(WARMUP, concurrency)
                result = generator.window(running[name].port, concurrency, MAX_REQUESTS, seconds, warmup)
                time.sleep(DRAIN)  # its span processor's last export billed to this window, not the next server's
                wall = time.monotonic() - start[0]
                result["server_cpu"] = (cpu_seconds(pid) - start[1]) / wall
                result["cpu_per_reply"] = (cpu_seconds(pid) - start[1]) / result["replies"]
                result["gc_per_reply"] = (running[name].gc_seconds() - gc_before) / result["replies"]
                result["sink_cpu"] = (cpu_seconds(sink_pid) - start[2]) / wall if sink_pid else 0.0
                round_[name] = result
            if index < first:
                continue
            results[concurrency].append(round_)
            print(
                f"  c={concurrency} round {index}: "
                + ", ".join(
                    f"{name} {round_[name]['rps']:,.0f} req/s p99 {round_[name]['p99'] * 1e3:.0f} ms "
                    f"{round_[name]['cpu_per_reply'] * 1e6:.0f} us CPU/reply"
                    for name in names
                ),
                flush=True,
            )


def ratios(rounds: list[dict[str, Any]], ours: str, key: str, over: str = "plain") -> list[float]:
    return [r[ours][key] / r[over][key] for r in rounds]


def summarize(results: dict[int, list[dict[str, Any]]]) -> bool:
    ok = True
    for concurrency, rounds in results.items():
        plain_rps = [r["plain"]["rps"] for r in rounds]
        print(
            f"concurrency {concurrency}: plain (A) {statistics.median(plain_rps):,.0f} req/s "
            f"[{min(plain_rps):,.0f}-{max(plain_rps):,.0f}], server CPU "
            f"{statistics.median(r['plain']['server_cpu'] for r in rounds):.0%}, OTLP sink CPU "
            f"{statistics.median(r['plain']['sink_cpu'] for r in rounds):.0%}"
        )
        checks = [
            ("requests/s B / minimum", ratios(rounds, "ng_otel", "rps", over="minimum"), ">=", 0.97),
            ("requests/s B/A", ratios(rounds, "ng_otel", "rps"), "", None),
            ("p99 B/A", ratios(rounds, "ng_otel", "p99"), "<=", 1.05),
            ("p50 B/A", ratios(rounds, "ng_otel", "p50"), "", None),
            ("server CPU per reply B/A", ratios(rounds, "ng_otel", "cpu_per_reply"), "", None),
        ]
        gc_share = {
            name: statistics.median(r[name]["gc_per_reply"] / r[name]["cpu_per_reply"] for r in rounds)
            for name in ("plain", "ng_otel")
        }
        for title, values, sense, target in checks:
            median = statistics.median(values)
            if title.startswith("server CPU"):
                verdict = "(the cost behind requests/s; less sensitive to time other processes take from the server)"
            elif title == "requests/s B/A":
                verdict = "(for scale, no target: the plain app does none of the contract's duties)"
            elif target is None:
                verdict = "(no target of its own: it follows requests/s; healthy p50 is latency.py's)"
            else:
                met = median >= target if sense == ">=" else median <= target
                ok &= met
                verdict = f"(target {sense} {target:.2f}) {'ok' if met else 'OVER TARGET'}"
            print(f"  c={concurrency} {title}: {median:.3f} {span(values)} {verdict}")
        shares = f"plain {gc_share['plain']:.1%}, ng_otel {gc_share['ng_otel']:.1%}"
        print(f"  the garbage collector's share of server CPU: {shares}")
        for title, key in (("requests/s", "rps"), ("server CPU per reply", "cpu_per_reply")):
            values = ratios(rounds, "minimum", key)
            print(
                f"  c={concurrency} {title} minimum/A: {statistics.median(values):.3f} {span(values)} "
                "(for scale: the hand-written minimum of the failing path, what B's requests/s target divides by)"
            )
        for key in ("rps", "p50", "p99", "cpu_per_reply"):
            values = ratios(rounds, "off", key)
            median = statistics.median(values)
            same = min(values) <= 1.0 <= max(values) or abs(median - 1) <= 0.01
            ok &= same
            print(
                f"  c={concurrency} switched off, {key} off/A: {median:.3f} {span(values)} "
                f"(target: indistinguishable, range includes 1.00 or within 1 %) {'ok' if same else 'DIFFERS'}"
            )
        failing = sum(r["ng_otel"]["failing"] for r in rounds)
        reported = sum(r["ng_otel"]["failing_with_report"] for r in rounds)
        stray = sum(r[name]["healthy_with_report"] for r in rounds for name in r)
        errors = sum(r[name]["errors"] + r[name]["bad_status"] for r in rounds for name in r)
        complete = failing > 0 and reported == failing and not stray and not errors
        ok &= complete
        print(
            f"  c={concurrency} failing replies of B carrying X-NG-Failure-Report: {reported:,} of {failing:,}; "
            f"healthy replies carrying one: {stray}; transport errors or unexpected statuses: {errors} "
            f"(target: all, 0, 0) {'ok' if complete else 'MISSING'}"
        )
    return ok


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=2, help="fresh sets of server processes, one after another")
    parser.add_argument("--rounds", type=int, default=5, help="per launch and concurrency")
    parser.add_argument("--seconds", type=float, default=2.5, help="measured seconds per window at 256 (x4 at 1,024)")
    parser.add_argument("--exporter", choices=("otlp", "none"), default="otlp")
    args = parser.parse_args(argv)
    print(
        f"throughput: uvicorn --loop uvloop --http httptools, ~2 KB JSON, 5 % failing with a 3-event chain; "
        f"{args.launches} launches of {args.rounds} rounds of {args.seconds:g} s per variant, exporter {args.exporter}",
        flush=True,
    )
    sink = otlp_sink() if args.exporter == "otlp" else nullcontext((None, None))
    with sink as (endpoint, sink_pid):
        results = measure(args, sink_pid, {**telemetry_env(args.exporter, endpoint), **EXPORT_WITHIN_DRAIN})
    return summarize(results)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
