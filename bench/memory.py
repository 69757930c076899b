"""Peak RSS of one server holding 16,384 requests in flight at once, with ng_otel (B) and
without (A): the throughput benchmark's app (uvicorn on uvloop and httptools, OpenTelemetry
tracing and metrics exporting OTLP to a sink on 127.0.0.1), its ``POST /hold`` route awaiting
an event until every request is in, then all released. Once with every request healthy, once
with 5 % of them failing with a three-event cause chain when released. Each measurement is a
fresh server process (its VmHWM is that run's own); A and B alternate.

Target: peak RSS B/A <= 1.05 in both mixes. Every failing reply of B carries its report.
Run: .venv/bin/python bench/memory.py [--rounds 2] [--in-flight 16384]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _procs import load, load_generator, memory_kib, otlp_sink, servers
from throughput import telemetry_env


def one(variant: str, env: dict[str, str], in_flight: int, failing: bool) -> dict[str, float]:
    with servers({variant: (variant, env)}) as running:
        server = running[variant]
        with load_generator() as generator:  # every route and lazy import used once
            generator.window(server.port, 64, 5_000, 1.0, 0.5)
        before = memory_kib(server.pid)["VmRSS"]
        result = load("hold", server.port, in_flight, 240, int(failing), timeout=300)
        peak = memory_kib(server.pid)["VmHWM"]
    if result["in_flight"] != in_flight or result["errors"]:
        raise RuntimeError(f"{variant}: {result}")
    return {"before": before / 1024, "peak": peak / 1024, **result}


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--in-flight", type=int, default=16_384)
    args = parser.parse_args(argv)
    ok = True
    with otlp_sink() as (endpoint, _):
        env = telemetry_env("otlp", endpoint)
        for failing in (False, True):
            runs: list[dict[str, dict[str, float]]] = []
            for index in range(args.rounds):
                order = ["plain", "ng_otel"] if index % 2 == 0 else ["ng_otel", "plain"]
                runs.append({variant: one(variant, env, args.in_flight, failing) for variant in order})
            mix = "5 % failing" if failing else "all healthy"
            ratios = [run["ng_otel"]["peak"] / run["plain"]["peak"] for run in runs]
            median = statistics.median(ratios)
            met = median <= 1.05
            ok &= met
            for name in ("plain", "ng_otel"):
                peaks = [run[name]["peak"] for run in runs]
                grown = [(run[name]["peak"] - run[name]["before"]) * 1024 / args.in_flight for run in runs]
                low, high = min(peaks), max(peaks)
                print(
                    f"  {mix}, {name}: peak RSS {statistics.median(peaks):.0f} MiB [{low:.0f}-{high:.0f}], "
                    f"{statistics.median(grown):.1f} KiB per in-flight request over the idle server"
                )
            print(
                f"peak RSS at {args.in_flight:,} in-flight requests, {mix}, B/A: {median:.3f} "
                f"[{min(ratios):.3f}-{max(ratios):.3f}] (target <= 1.05) {'ok' if met else 'OVER TARGET'}"
            )
            if failing:
                count = sum(run["ng_otel"]["failing"] for run in runs)
                reported = sum(run["ng_otel"]["failing_with_report"] for run in runs)
                complete = count > 0 and reported == count
                ok &= complete
                print(
                    f"  failing replies of B carrying X-NG-Failure-Report: {reported:,} of {count:,} "
                    f"(target: all) {'ok' if complete else 'MISSING'}"
                )
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
