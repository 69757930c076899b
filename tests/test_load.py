"""1,000 concurrent rollouts through the three-server stack with failures injected at a known
rate: every injected failure arrives over OTLP exactly once, every cause link resolves,
ng.failures counts exactly what was injected, and no failing reply lacks its report."""

import time
from collections import Counter

import pytest

from ng_otel.cli.demo_stack.stack import gym_stack, run_collection
from ng_otel.cli.receiver import OtlpReceiver

pytestmark = pytest.mark.e2e

# Per 20 rollouts: 5 x 3-event chains, 2 x 2-event chains, 1 recovered retry, 12 healthy.
PATTERN = ["model_timeout"] * 5 + ["judge_failed"] * 2 + ["retry_recovered"] + ["ok"] * 12
EVENTS = {"model_timeout": 3, "judge_failed": 2, "retry_recovered": 1, "ok": 0}
STATUS = {"model_timeout": 500, "judge_failed": 500, "retry_recovered": 200, "ok": 200}
ROLLOUTS, CONCURRENCY = 1000, 50


def test_a_thousand_concurrent_rollouts_lose_nothing_and_duplicate_nothing(tmp_path):
    receiver = OtlpReceiver().start()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    }
    scenarios = (PATTERN * (ROLLOUTS // len(PATTERN)))[:ROLLOUTS]
    injected = sum(EVENTS[s] for s in scenarios)
    try:
        started = time.monotonic()
        with gym_stack(env=env, log_dir=tmp_path) as urls:
            rows = run_collection(
                urls.agent,
                tmp_path / "rows.jsonl",
                env,
                scenarios=PATTERN,
                repeat=ROLLOUTS // len(PATTERN),
                concurrency=CONCURRENCY,
            )
        elapsed = time.monotonic() - started
        assert len(rows) == ROLLOUTS
        assert Counter((r["scenario"], r["status"]) for r in rows) == Counter((s, STATUS[s]) for s in scenarios)
        assert all(r["report_header"] for r in rows if EVENTS[r["scenario"]])
        assert sum(len(r.get("_ng_failure_events", {})) for r in rows) == injected

        def arrived():
            return len(receiver.failure_events())

        assert receiver.wait_for(lambda: arrived() >= injected, timeout=60), (arrived(), injected)
        events = receiver.failure_events()
        ids = [e["ng.failure.id"] for e in events]
        assert len(ids) == len(set(ids)) == injected
        where = {e["ng.failure.id"]: e["_span"] for e in events}
        resolved = 0
        for event in events:
            cause = event.get("ng.failure.cause_id")
            if cause is None:
                continue
            assert cause in where, "a cause that never arrived"
            cause_span, span = where[cause], event["_span"]
            if (cause_span["trace_id"], cause_span["span_id"]) == (span["trace_id"], span["span_id"]):
                continue
            links = [
                (link["trace_id"], link["span_id"])
                for link in span["links"]
                if link["attributes"].get("ng.failure.id") == event["ng.failure.id"]
            ]
            assert links == [(cause_span["trace_id"], cause_span["span_id"])]
            resolved += 1
        assert resolved == ROLLOUTS // len(PATTERN) * (5 + 2)  # harness->model, agent->judge per chain

        def counted():
            return sum(p["value"] for p in receiver.metric_points("ng.failures"))

        assert receiver.wait_for(lambda: counted() == injected, timeout=30), (counted(), injected)
        print(f"\n{ROLLOUTS} rollouts ({CONCURRENCY} in flight), {injected} failure events: {elapsed:.1f}s")
    finally:
        receiver.stop()
