"""Three Gym-shaped servers and a collection driver, each its own process, talking over real
HTTP on 127.0.0.1 and exporting over real OTLP (gRPC from the servers, HTTP from collection)
to the test receiver. Everything asserted here is what arrived over the wire."""

import json
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from ng_otel.cli.demo_stack.stack import gym_stack, run_collection
from ng_otel.cli.receiver import OtlpReceiver
from ng_otel.contract import FailureReport
from ng_otel.gym.collection import row_report

pytestmark = pytest.mark.e2e

FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_METRIC_EXPORT_INTERVAL": "500"}


def collect(agent_url, out: Path, env):
    return {row["scenario"]: row for row in run_collection(agent_url, out, env)}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    receiver = OtlpReceiver().start()
    servers_env = {
        **FAST_EXPORT,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    collection_env = {
        **FAST_EXPORT,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    }
    logs = tmp_path_factory.mktemp("logs")
    with gym_stack(env=servers_env, log_dir=logs) as urls:
        rows = collect(urls.agent, logs / "rows.jsonl", collection_env)
        direct = {
            "episode_lost": post(f"{urls.resources}/episode", {"scenario": "episode_lost"}),
            "episode_ok": post(f"{urls.resources}/episode", {"scenario": "ok"}),
            "verify": [
                post(f"{urls.resources}/verify", {"scenario": scenario})
                for scenario in ["masked", "masked", "degraded", "ok", "ok", "ok", "hostile_verify"]
            ],
        }
    reports = {scenario: row_report(row) for scenario, row in rows.items()}
    expected = {eid for report in reports.values() if report for eid in report.events}
    # Servers flush on shutdown; wait until every event any reply reported has arrived.
    assert receiver.wait_for(lambda: expected <= {e["ng.failure.id"] for e in receiver.failure_events()}, 30)
    yield SimpleNamespace(rows=rows, reports=reports, receiver=receiver, direct=direct)
    receiver.stop()


def post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.status, {k.lower(): v for k, v in reply.headers.items()}, json.loads(reply.read())


def by_id(receiver):
    events = receiver.failure_events()
    return {event["ng.failure.id"]: event for event in events}


def test_every_event_is_exported_exactly_once_and_every_cause_link_points_at_its_causes_span(run):
    receiver = run.receiver
    events = receiver.failure_events()
    ids = [event["ng.failure.id"] for event in events]
    assert len(ids) == len(set(ids))
    index = by_id(receiver)
    checked = 0
    for event in events:
        cause_id = event.get("ng.failure.cause_id")
        if cause_id is None or cause_id not in index:
            continue
        cause_span = index[cause_id]["_span"]
        cause_at = (cause_span["trace_id"], cause_span["span_id"])
        own_links = [
            link for link in event["_span"]["links"] if link["attributes"]["ng.failure.id"] == event["ng.failure.id"]
        ]
        targets = [(link["trace_id"], link["span_id"]) for link in own_links]
        if cause_at == (event["_span"]["trace_id"], event["_span"]["span_id"]):
            assert targets == []  # same span: ng.failure.cause_id says it; a self-link would add nothing
            continue
        assert targets == [cause_at]
        assert own_links[0]["attributes"]["ng.link.type"] == "caused_by"
        checked += 1
    assert checked == 3  # harness->model, agent->judge_failed, agent->verifier_error


def test_model_timeout_chain_crosses_three_processes_as_one_linked_trace(run):
    rows, reports, receiver = run.rows, run.reports, run.receiver
    row, report = rows["model_timeout"], reports["model_timeout"]
    assert row["status"] == 500 and row["error"]["failure"]["failure_kind"] == "agent_run_error"
    chain = report.chain()
    assert [(r["boundary"], r["failure_kind"]) for r in chain] == [
        ("agent", "agent_run_error"),
        ("harness", "agent_run_error"),
        ("model", "transport_timeout"),
    ]
    index = by_id(receiver)
    services = [index[r["event_id"]]["_span"]["service"] for r in chain]
    assert services == ["agent-server", "agent-server", "model-server"]
    assert {index[r["event_id"]]["_span"]["trace_id"] for r in chain} == {row["trace_id"]}
    model_event = index[chain[-1]["event_id"]]
    assert model_event["ng.failure.class"] == "infra" and model_event["http.response.status_code"] == 504
    agent_span = index[chain[0]["event_id"]]["_span"]
    assert agent_span["status"] == 2 and agent_span["attributes"]["error.type"] == "agent_run_error"


def test_success_reply_carries_the_recovered_retry(run):
    rows, reports, receiver = run.rows, run.reports, run.receiver
    row, report = rows["retry_recovered"], reports["retry_recovered"]
    assert row["status"] == 200 and "_ng_failure_id" not in row
    (event_id,) = report.events
    assert report.recovered_ids() == {event_id}
    assert report.events[event_id]["failure_kind"] == "provider_unavailable"
    assert by_id(receiver)[event_id]["_span"]["service"] == "model-server"


def test_judge_failure_keeps_its_provider_cause_as_foreign_error(run):
    reports, receiver = run.reports, run.receiver
    judge = next(r for r in reports["judge_failed"].events.values() if r["failure_kind"] == "judge_failed")
    assert judge["foreign_error"] == {
        "type": "ng_otel.cli.demo_stack.servers.JudgeSdkError",
        "message": "429 Too Many Requests: judge rate limit reached",
        "http_status": 429,
    }
    exported = by_id(receiver)[judge["event_id"]]
    assert exported["ng.failure.foreign.type"] == "ng_otel.cli.demo_stack.servers.JudgeSdkError"
    assert exported["_span"]["service"] == "resources-server"


def test_foreign_exception_between_gym_failures_keeps_the_lower_cause_linked(run):
    reports = run.reports
    report = reports["foreign_between"]
    kinds = [r["failure_kind"] for r in report.chain()]
    assert kinds == ["agent_run_error", "verifier_error", "session_lost"]
    verifier = report.chain()[1]
    assert verifier["foreign_error"]["type"] == "RuntimeError"


def test_oversized_report_is_omitted_on_every_hop_and_the_real_reply_still_arrives(run):
    rows, reports, receiver = run.rows, run.reports, run.receiver
    row = rows["oversized"]
    assert row["status"] == 500 and row["error"]["failure"]["failure_kind"] == "agent_run_error"
    assert row["_ng_failure_events_omitted"] is True
    report = reports["oversized"]
    assert report.omitted
    harness = report.chain()[1]
    assert harness["foreign_error"]["http_status"] == 503  # the model's real status still arrived
    model_kinds = {e["ng.failure.kind"] for e in receiver.failure_events() if e["_span"]["service"] == "model-server"}
    assert {"provider_quota_exhausted", "provider_unavailable"} <= model_kinds


def test_malformed_peer_header_becomes_one_protocol_violation_and_the_request_succeeds(run):
    rows, reports, receiver = run.rows, run.reports, run.receiver
    row, report = rows["malformed_header"], reports["malformed_header"]
    assert row["status"] == 200 and row["reward"] == 1.0  # the verify reply, at the top of the row
    (record,) = report.events.values()
    assert record["failure_kind"] == "protocol_violation" and record["boundary"] == "harness"
    assert "X-NG-Failure-Report" in record["failure_reason"]
    violations = [e for e in receiver.failure_events() if e["ng.failure.kind"] == "protocol_violation"]
    assert len(violations) == 1 and violations[0]["ng.failure.recovered"] is True


def test_a_healthy_rollout_carries_no_failure_keys(run):
    rows = run.rows
    assert rows["ok"]["status"] == 200
    assert not any(key.startswith("_ng_failure") for key in rows["ok"])


def test_failures_are_counted_once_with_bounded_labels(run):
    reports, receiver = run.reports, run.receiver
    expected = {eid for report in reports.values() if report for eid in report.events}
    assert receiver.wait_for(
        lambda: sum(p["value"] for p in receiver.metric_points("ng.failures")) == len(receiver.failure_events())
    )
    points = receiver.metric_points("ng.failures")
    assert sum(p["value"] for p in points) >= len(expected)
    allowed = {"ng.failure.boundary", "ng.failure.kind", "ng.failure.stage", "ng.failure.recovered", "ng.failure.class"}
    assert all(set(p["attributes"]) <= allowed for p in points)


def test_replies_are_unaffected_when_the_otlp_endpoint_is_down(run, tmp_path):
    live_rows = run.rows
    down = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    with gym_stack(env=down, log_dir=tmp_path) as urls:
        rows = collect(urls.agent, tmp_path / "rows.jsonl", down)
    assert {s: r["status"] for s, r in rows.items()} == {s: r["status"] for s, r in live_rows.items()}
    for scenario, row in rows.items():
        report = row_report(row)
        live = row_report(live_rows[scenario])
        assert (report is None) == (live is None)
        if report is not None:
            assert [r["failure_kind"] for r in report.chain()] == [r["failure_kind"] for r in live.chain()]
    assert FailureReport  # the rows decode with the public contract


def test_an_environments_handled_failures_come_back_as_the_v1_envelope_with_the_report_beside_it(run):
    status, headers, body = run.direct["episode_lost"]
    assert status == 200 and body["result"] is None  # exactly one of result and failure, as upstream
    assert body["episode_id"] == {"rollout_id": "episode_lost", "attempt": 0}
    assert body["failure"] == {
        "failure_reason": "sandbox session lost mid-episode",
        "terminal": True,
        "failure_kind": "session_lost",
        "stage": "agent",
    }
    report = FailureReport.from_dict(body["failure_report"])
    assert report == FailureReport.from_header(headers["x-ng-failure-report"])
    kinds = {record["failure_kind"]: record for record in report.events.values()}
    assert set(kinds) == {"session_lost", "transport_peer_drop", "session_release_failed"}
    assert report.failure_id == kinds["session_lost"]["event_id"]
    assert kinds["session_lost"]["cause_id"] == kinds["transport_peer_drop"]["event_id"]
    assert kinds["session_release_failed"]["stage"] == "cleanup"
    assert "partial" not in body  # BaseEpisodeResponse forbids unknown keys
    receiver = run.receiver
    assert receiver.wait_for(lambda: set(report.events) <= set(by_id(receiver)))
    exported = [e for e in receiver.failure_events() if e["ng.failure.id"] in report.events]
    assert len(exported) == 3
    assert {e["_span"]["status"] for e in exported} == {0}  # handled: the span is not an error
    assert run.direct["episode_ok"][2]["result"] == {"trajectory": ["reset", "observe", "act"]}
    assert "failure" not in run.direct["episode_ok"][2]


def test_verify_outcomes_are_counted_exactly_and_named_kinds_become_events(run):
    receiver = run.receiver
    assert all(status == 200 for status, _, _ in run.direct["verify"])
    assert run.direct["verify"][-1][2]["reward"] == "not a number"  # hostile body passed through

    def outcomes():
        return {
            (p["attributes"]["ng.verify.masked"], p["attributes"]["ng.failure.kind"]): p["value"]
            for p in receiver.metric_points("ng.verify.outcomes")
        }

    expected = {(False, "none"): 6, (True, "session_lost"): 3, (False, "judge_unparseable"): 1}
    assert receiver.wait_for(lambda: outcomes() == expected), outcomes()
    verify_events = [
        e for e in receiver.failure_events() if e.get("ng.failure.stage") == "verification" and "ng.verify.masked" in e
    ]
    masked = sorted((e["ng.failure.kind"], e["ng.verify.masked"]) for e in verify_events)
    assert masked == [("judge_unparseable", False)] + [("session_lost", True)] * 3
