"""Replay of saved rows vs the bare SDK creating the same spans and events by hand.

Target: replay at most 2x the bare SDK's time. Also prints the peak RSS after 20% and after
all rows, which stays flat because rows stream and the link index is bounded.
Run: .venv/bin/python bench/replay.py [rows, default 100000]
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _measure import report
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from ng_otel.contract import NgFailureEvent, failure_report_for
from ng_otel.gym.collection import ReplaySummary, replay_row, report_row
from ng_otel.otel import names
from ng_otel.otel.recorder import FailureRecorder, install_recorder
from ng_otel.runs.inputs import read_json_lines

CHUNK = 5_000


def rows_file(count: int, path: Path) -> None:
    with path.open("w") as out:
        for index in range(count):
            model = NgFailureEvent(
                "transport_timeout", f"rollout {index}: model timed out", boundary="model", http_status=504
            )
            harness = NgFailureEvent("agent_run_error", "harness gave up", boundary="harness", stage="agent")
            harness.__cause__ = model
            agent = NgFailureEvent("agent_run_error", "rollout failed", boundary="agent", http_status=500)
            agent.__cause__ = harness
            row = {"task": index, "reward": 0.0, **report_row(failure_report_for(agent), contexts={})}
            out.write(json.dumps(row) + "\n")


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(count: int = 100_000) -> bool:
    tracer_provider = TracerProvider()
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    install_recorder(FailureRecorder(tracer_provider.get_tracer("ng_otel"), meter_provider.get_meter("ng_otel")))
    bare_tracer = tracer_provider.get_tracer("bare")
    bare_counter = meter_provider.get_meter("bare").create_counter("bare.failures")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.jsonl"
        rows_file(count, path)
        summary = ReplaySummary()
        ours = bare = 0.0
        rss_early = 0.0
        with path.open("rb") as ours_stream, path.open("rb") as bare_stream:
            ours_lines, bare_lines = read_json_lines(ours_stream), read_json_lines(bare_stream)
            for done in range(0, count, CHUNK):  # alternate chunks: noise hits both the same
                start = time.perf_counter()
                for _ in range(min(CHUNK, count - done)):
                    number, row = next(ours_lines)
                    replay_row(row, number, summary)
                ours += time.perf_counter() - start
                start = time.perf_counter()
                for _ in range(min(CHUNK, count - done)):
                    _, row = next(bare_lines)
                    events = row["_ng_failure_events"]
                    span = bare_tracer.start_span(names.REPLAY_SPAN)
                    for record in events.values():
                        attributes = {
                            names.ID: record["event_id"],
                            names.BOUNDARY: record["boundary"],
                            names.KIND: record["failure_kind"],
                            names.REASON: record["failure_reason"],
                            names.RECOVERED: False,
                            names.CLASS: "infra",
                        }
                        span.add_event(names.EVENT, attributes)
                        bare_counter.add(1, {names.BOUNDARY: record["boundary"], names.KIND: record["failure_kind"]})
                    span.end()
                bare += time.perf_counter() - start
                if done + CHUNK >= count // 5 and not rss_early:
                    rss_early = rss_mib()
    # Every row replayed, none skipped (SkippedLines is an object, always true: its count says)
    if summary.events_recorded != 3 * count or summary.skipped_rows:
        lost = f"{summary.events_recorded:,} events of {3 * count:,}, {summary.skipped_rows} rows skipped"
        raise RuntimeError(f"replay lost rows: {lost}")
    print(f"replay: {count / ours:,.0f} rows/s; bare SDK: {count / bare:,.0f} rows/s")
    print(f"peak RSS after {count // 5:,} rows: {rss_early:.0f} MiB; after {count:,}: {rss_mib():.0f} MiB")
    return report(f"replay of {count:,} rows vs bare SDK (per row)", ours / count, bare / count, target=2.0)


if __name__ == "__main__":
    sys.exit(0 if main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000) else 1)
