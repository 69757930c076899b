"""Against a real Jaeger (v2, OTLP on 4318) when NG_OTEL_TEST_JAEGER_URL names its query
endpoint, e.g. http://127.0.0.1:16686; Jaeger cannot be installed on the CI machines."""

import json
import os
import urllib.parse
import urllib.request

import pytest

from ng_otel.cli.demo_stack.stack import gym_stack, run_collection
from ng_otel.gym.collection import row_report
from tests.conftest import wait_until

JAEGER = os.environ.get("NG_OTEL_TEST_JAEGER_URL")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(JAEGER is None, reason="set NG_OTEL_TEST_JAEGER_URL to a Jaeger query URL to run"),
]


def test_the_model_timeout_chain_is_one_trace_with_caused_by_references(tmp_path):
    otlp = os.environ.get(
        "NG_OTEL_TEST_JAEGER_OTLP",
        f"{urllib.parse.urlsplit(JAEGER).scheme}://{urllib.parse.urlsplit(JAEGER).hostname}:4318",
    )
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    with gym_stack(env=env, log_dir=tmp_path) as urls:
        (row,) = run_collection(urls.agent, tmp_path / "rows.jsonl", env, scenarios=["model_timeout"])
    wanted = set(row_report(row).events)

    def trace_spans():
        with urllib.request.urlopen(f"{JAEGER}/api/traces/{row['trace_id']}", timeout=5) as reply:
            return json.loads(reply.read())["data"][0]["spans"]

    def failure_ids(spans):
        return {
            field["value"]
            for span in spans
            for log in span.get("logs", [])
            for field in log["fields"]
            if field["key"] == "ng.failure.id"
        }

    def complete():
        spans = trace_spans()
        return spans if failure_ids(spans) >= wanted else None

    spans = wait_until(complete, 30, f"Jaeger to hold the failure events {sorted(wanted)}")
    found = failure_ids(spans)
    assert found >= wanted
    harness_span = next(
        s
        for s in spans
        for log in s.get("logs", [])
        for f in log["fields"]
        if f["key"] == "ng.failure.kind" and f["value"] == "agent_run_error"
    )
    span_ids = {span["spanID"] for span in spans}
    assert any(ref["spanID"] in span_ids for ref in harness_span.get("references", []) if ref["refType"] != "CHILD_OF")
