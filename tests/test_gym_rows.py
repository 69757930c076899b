"""NeMo Gym 0.7.0's failure rows read as failures, next to Gym Main's saved reports.

The rows are built in the shape 0.7.0's own code writes them (``_agent_request_failure_row``,
the environment-failure record and ``judge_failsafe`` in ``nemo_gym/rollout_collection.py``
and ``nemo_gym/judge.py``); ``tests/test_real_gym.py`` reads rows Gym itself wrote.
"""

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from inline_snapshot import Is, snapshot

from ng_otel import NgFailureEvent
from ng_otel.contract.report import failure_report_for
from ng_otel.contract.rows import NO_REASON, _sorted_json, class_row_failure, row_report, row_terminal
from ng_otel.gym.collection import report_row

AGENT_REQUEST_FAILED = {
    "_ng_task_index": 3,
    "_ng_rollout_index": 0,
    "_ng_failure_class": "agent_request_failed",
    "_ng_failure_type": "ClientConnectorError",
    "_ng_failure_message": "Cannot connect to host 127.0.0.1:9 ssl:default [Connection refused]",
    "_ng_failure_http_status": None,
    "_ng_failure_response_body": None,
}
AGENT_RUN_ERROR = {
    "_ng_task_index": 4,
    "_ng_rollout_index": 1,
    "_ng_failure_class": "agent_run_error",
    "_ng_failure_type": "ClientResponseError",
    "_ng_failure_message": "500, message='Internal Server Error'",
    "_ng_failure_http_status": 500,
    "_ng_failure_response_body": "\"NgFailureEvent('transport_timeout', ...)\"",
}
ENVIRONMENT_FAILED = {
    "_ng_task_id": "task-7",
    "_ng_failure_class": "environment_server_failed",
    "_ng_failure_terminal": True,
    "_ng_failure_message": "sandbox never became ready",
    "_ng_failure_stage": "seed",
}
# judge_failsafe's masked reply as collection saves it (routed to the sidecar in 0.7.0).
JUDGE_ROW = {
    "_ng_task_index": 5,
    "_ng_rollout_index": 0,
    "responses_create_params": {"input": "2+2?"},
    "reward": 0.0,
    "mask_sample": True,
    "failure_kind": "judge_failed",
    "failure_reason": "ClientResponseError: 503, message='Service Unavailable'",
    "instance_config": {"mask_sample": True},
    "_ng_failure_class": "judge_failed",
    "_ng_failure_judge_error": "ClientResponseError: 503, message='Service Unavailable'",
}


def only_event(row):
    report = row_report(row)
    (record,) = report.events.values()
    assert report.failure_id == record["event_id"]
    return record


def test_a_sidecar_row_is_one_failure_seen_by_collection_with_its_foreign_error():
    record = only_event(AGENT_REQUEST_FAILED)
    assert record == snapshot(
        {
            "event_id": Is(record["event_id"]),  # derived from the row: see test_the_event_id_names_the_same_row...
            "boundary": "collection",
            "failure_kind": "agent_request_failed",
            "failure_reason": "Cannot connect to host 127.0.0.1:9 ssl:default [Connection refused]",
            "foreign_error": {
                "type": "ClientConnectorError",
                "message": "Cannot connect to host 127.0.0.1:9 ssl:default [Connection refused]",
            },
        }
    )


def test_a_rollout_that_ran_and_broke_keeps_its_status():
    record = only_event(AGENT_RUN_ERROR)
    assert record["failure_kind"] == "agent_run_error" and record["http_status"] == 500
    assert record["foreign_error"] == {
        "type": "ClientResponseError",
        "message": "500, message='Internal Server Error'",
        "http_status": 500,
    }


def test_an_environment_reported_failure_is_the_environments_with_stage_and_terminal():
    record = only_event(ENVIRONMENT_FAILED)
    assert (record["boundary"], record["stage"], record["failure_reason"]) == (
        "environment",
        "seed",
        "sandbox never became ready",
    )
    assert "foreign_error" not in record
    assert row_terminal(ENVIRONMENT_FAILED) is True and row_terminal(AGENT_REQUEST_FAILED) is None


def test_a_judge_row_in_the_main_rows_is_the_resources_servers_verification_failure():
    record = only_event(JUDGE_ROW)
    assert (record["boundary"], record["failure_kind"], record["stage"]) == (
        "resources_server",
        "judge_failed",
        "verification",
    )
    assert record["failure_reason"] == JUDGE_ROW["_ng_failure_judge_error"]


def test_the_event_id_names_the_same_row_the_same_way_every_time():
    first, again = only_event(AGENT_REQUEST_FAILED), only_event(json.loads(json.dumps(AGENT_REQUEST_FAILED)))
    other = only_event({**AGENT_REQUEST_FAILED, "_ng_task_index": 9})
    assert first["event_id"] == again["event_id"] != other["event_id"]
    assert len(first["event_id"]) == 32


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    # one key type a mapping: json.dumps cannot sort str and int keys together (ours can)
    lambda children: (
        st.lists(children) | st.dictionaries(st.text(), children) | st.dictionaries(st.integers(), children)
    ),
)


@given(_JSON_VALUES)
def test_the_ids_fallback_text_is_what_json_dumps_writes(value):
    # The fallback for what orjson cannot write (integers past 64 bits, nesting past 255
    # levels) names a row exactly as the standard library would, only without recursion.
    assert _sorted_json(value) == json.dumps(value, sort_keys=True, default=repr)


def test_a_row_nested_deeper_than_json_dumps_can_follow_is_still_one_failure():
    line = b'{"_ng_failure_class": "agent_run_error", "deep": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    row = orjson.loads(line)  # orjson reads 1,024 levels; orjson.dumps writes 255, json.dumps ~300
    assert only_event(row)["event_id"] == only_event(orjson.loads(line))["event_id"]
    assert only_event({**row, "big": 2**70})["event_id"] != only_event(row)["event_id"]
    assert class_row_failure(row) == ("agent_run_error", "collection", None, None, False)


def test_unregistered_classes_are_kept_and_a_class_that_is_no_kind_is_a_clear_error():
    assert only_event({**AGENT_REQUEST_FAILED, "_ng_failure_class": "timeout_exceeded"})["failure_kind"] == (
        "timeout_exceeded"
    )
    with pytest.raises(ValueError, match="_ng_failure_class"):
        row_report({**AGENT_REQUEST_FAILED, "_ng_failure_class": "Timeout Exceeded"})


def test_bounds_and_odd_values_never_reach_the_record():
    row = {
        "_ng_failure_class": "agent_run_error",
        "_ng_failure_type": "X" * 1000,
        "_ng_failure_message": "m" * 100_000,
        "_ng_failure_http_status": 700,
        "_ng_failure_stage": "nowhere",
    }
    record = only_event(row)
    assert len(record["failure_reason"]) == 2000 and record["failure_reason"].endswith("...[truncated]")
    assert len(record["foreign_error"]["type"]) == 256
    assert "http_status" not in record and "stage" not in record
    assert only_event({"_ng_failure_class": "agent_run_error"})["failure_reason"] == NO_REASON


def test_gym_mains_saved_report_wins_and_rows_without_failures_have_none():
    try:
        raise NgFailureEvent("transport_timeout", "model timed out", boundary="model")
    except NgFailureEvent as error:
        report = failure_report_for(error)
    assert row_report({**AGENT_RUN_ERROR, **report_row(report, contexts={})}) == report
    assert row_report({"_ng_task_index": 1, "reward": 1.0}) is None


def test_show_draws_both_formats_from_one_file(tmp_path, cli):
    try:
        raise NgFailureEvent("transport_timeout", "model timed out", boundary="model")
    except NgFailureEvent as error:
        saved = {"scenario": "new-format", **report_row(failure_report_for(error), contexts={})}
    rows = tmp_path / "rows_failures.jsonl"
    rows.write_text("\n".join(json.dumps(row) for row in (AGENT_REQUEST_FAILED, ENVIRONMENT_FAILED, JUDGE_ROW, saved)))
    done = cli("show", str(rows))
    assert done.returncode == 0, done.stderr
    assert "4 failure chain group(s) shown" in done.stdout
    for expected in (
        "agent_request_failed  collection",
        "environment_server_failed  environment · stage seed",
        "judge_failed  resources_server · stage verification",
        "transport_timeout  model",
        "task 3 · rollout 0",
        "terminal",
        "via ClientConnectorError",
    ):
        assert expected in done.stdout


@pytest.mark.e2e
def test_replay_exports_one_event_per_gym_failure_row_and_is_idempotent_by_id(tmp_path, otlp, ng_otel_process):
    rows = tmp_path / "rollouts_failures.jsonl"
    rows.write_text("\n".join(json.dumps(row) for row in (AGENT_REQUEST_FAILED, AGENT_RUN_ERROR, JUDGE_ROW)) + "\n")
    environment = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.grpc_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_METRICS_EXPORTER": "none",
    }
    done = ng_otel_process("replay", str(rows), env=environment)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 with failures, 3 events exported" in done.stdout
    assert otlp.wait_for(lambda: len(otlp.failure_events()) == 3)
    kinds = sorted(event["ng.failure.kind"] for event in otlp.failure_events())
    assert kinds == ["agent_request_failed", "agent_run_error", "judge_failed"]
    ids = {event["ng.failure.id"] for event in otlp.failure_events()}
    assert ids == {only_event(row)["event_id"] for row in (AGENT_REQUEST_FAILED, AGENT_RUN_ERROR, JUDGE_ROW)}
