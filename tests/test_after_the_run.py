"""After the run, answered: a Gym 0.7.0 run's files read as Gym writes them (main rows, the
failures sidecar, the materialized inputs), by summary, show, report and replay alike: where
it failed (the servers a nested error body names), why (the provider's own message at the
root), and how much of the run was lost (the coverage account, the prompt groups left short)."""

import itertools
import json
from pathlib import Path

import orjson
import pytest
from rich.text import Text

from ng_otel.runs.summary import summarise
from tests.test_inner_errors import LANE_KEYS, failure_row, gym_body

POLICY, AGENT = "policy_model", "simpleqa_simple_agent"


def scored(task: int, rollout: int, *, masked: bool = False) -> dict:
    row = {"_ng_task_index": task, "_ng_rollout_index": rollout, "agent_ref": {"name": AGENT}, "reward": 1.0}
    if masked:
        row.update(mask_sample=True, reward=0.0)
    return row


def write(path: Path, rows: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


@pytest.fixture
def run(tmp_path) -> Path:
    """Three tasks x two rollouts: 2 measured, 1 masked, 1 failed (the model's provider down,
    three servers deep), 1 failed then scored (measured), 1 that never finished."""
    inputs = [
        {"_ng_task_index": t, "_ng_rollout_index": r, "agent_ref": {"name": AGENT}} for t in range(3) for r in (0, 1)
    ]
    write(tmp_path / "rollouts_materialized_inputs.jsonl", inputs)
    write(tmp_path / "rollouts.jsonl", [scored(0, 0), scored(0, 1), scored(1, 1, masked=True), scored(2, 0)])
    down = failure_row(gym_body(*LANE_KEYS), _ng_task_index=1, _ng_rollout_index=0)
    retried = failure_row(gym_body(*LANE_KEYS), _ng_task_index=2, _ng_rollout_index=0)  # then scored
    write(tmp_path / "rollouts_failures.jsonl", [down, retried])
    return tmp_path / "rollouts.jsonl"


def test_the_rows_named_bring_their_sidecar_and_inputs_and_the_account_adds_up(run):
    got = summarise([run]).to_json()
    assert got["coverage"] == {"expected": 6, "measured": 3, "masked": 1, "failed": 1, "omitted": 0, "unknown": 1}
    assert got["coverage_by_agent"] == {AGENT: got["coverage"]}
    assert got["unknown_rollouts"] == [{"run": str(run), "task_index": 2, "rollout_index": 1}]
    # Task 1's rollouts: one masked, one failed: no valid member; task 2: one of its two unknown.
    short = [(group["task_index"], group["valid"], group["size"]) for group in got["groups_below_min_valid"]]
    assert short == [(1, 0, 2), (2, 1, 2)]
    assert summarise([run], min_valid=1).to_json()["groups_below_min_valid"] == [
        {"run": str(run), "task_index": 1, "valid": 0, "size": 2}
    ]
    # Naming the sidecar (or the inputs) instead gives the same run, read once.
    for named in ("rollouts_failures.jsonl", "rollouts_materialized_inputs.jsonl"):
        assert summarise([run.with_name(named)]).to_json()["coverage"] == got["coverage"]
    assert summarise([run, run.with_name("rollouts_failures.jsonl")]).to_json()["rows"] == got["rows"] == 6


def test_without_the_inputs_expected_and_unknown_are_absent_not_guessed(run):
    run.with_name("rollouts_materialized_inputs.jsonl").unlink()
    got = summarise([run]).to_json()
    assert got["coverage"] == {"expected": None, "measured": 3, "masked": 1, "failed": 1, "omitted": 0, "unknown": None}
    assert got["unknown_rollouts"] is None


def test_a_failed_rollout_says_which_servers_failed_and_the_provider_s_reason_at_the_root(run):
    got = summarise([run]).to_json()
    # Each failed row: collection's event caused by the agent twice and the policy model.
    assert got["by_server"] == {AGENT: 4, "(unnamed)": 2, POLICY: 2}  # collection's own events: no row names it
    assert got["by_boundary"]["model"] == 2 and got["by_kind"]["provider_unavailable"] == 2
    (top, *_) = got["root_causes"]
    assert top == {"failure_kind": "provider_unavailable", "server": POLICY, "reason": "backend overloaded", "count": 2}


def test_the_terminal_view_names_the_servers_the_reason_and_the_rollout_that_never_finished(run, cli):
    done = cli("summary", str(run))
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "also read" in out and "rollouts_failures.jsonl" in out
    assert "failures by server" in out and POLICY in out and "backend overloaded" in out
    assert "1 rollout(s) never finished: task 2 rollout 1" in out
    assert "2 prompt group(s) with fewer than 2 valid" in out
    as_json = json.loads(cli("summary", "--json", "--min-valid", "1", str(run)).stdout)
    assert set(as_json["coverage"]) == {"expected", "measured", "masked", "failed", "omitted", "unknown"}
    assert len(as_json["groups_below_min_valid"]) == 1


def test_show_draws_a_0_7_0_row_as_the_chain_with_its_servers(run, cli):
    done = cli("show", str(run.with_name("rollouts_failures.jsonl")))
    assert done.returncode == 0, done.stderr
    tree = done.stdout.split("line 2")[0]
    kinds = [line.split("── ")[1].split()[0] for line in tree.splitlines() if "── " in line]
    assert kinds == ["agent_run_error", "agent_run_error", "agent_run_error", "provider_unavailable"]
    assert f"model · 500 · {POLICY}" in tree and "backend overloaded" in tree


def test_replay_exports_every_event_of_a_0_7_0_row_s_chain_once(run):
    from ng_otel.gym.collection import replay_rows
    from ng_otel.testing import capture_failures

    rows = [json.loads(line) for line in run.with_name("rollouts_failures.jsonl").read_text().splitlines()]
    with capture_failures() as telemetry:
        summary = replay_rows(rows)
    assert summary.events_recorded == 8 and len(telemetry.failure_events()) == 8
    telemetry.assert_linked()
    again = [event["ng.failure.id"] for event in telemetry.failure_events()]
    assert len(set(again)) == 8  # two rows, two chains: no id shared


def test_the_report_shows_root_causes_with_reasons_servers_in_the_trees_and_the_coverage(run):
    from ng_otel.cli.report import render_page

    page = render_page(summarise([run]), "")
    assert "backend overloaded" in page and f"model · {POLICY}" in page
    assert "Coverage: expected = measured + masked + failed + omitted + unknown" in page
    assert "task 2 rollout 1" in page


def _verify_point(total: int, masked: bool, kind: str) -> dict:
    attributes = [
        {"key": "ng.verify.masked", "value": {"boolValue": masked}},
        {"key": "ng.failure.kind", "value": {"stringValue": kind}},
    ]
    return {"asInt": str(total), "startTimeUnixNano": "1", "attributes": attributes}


def test_otlp_input_counts_traces_not_rows_and_masks_over_verify_outcomes(tmp_path):
    from ng_otel.cli.summary import headline

    masked_event = {
        "name": "ng.failure",
        "timeUnixNano": str(60_000_000_000 * 10),
        "attributes": [
            {"key": "ng.failure.id", "value": {"stringValue": "e1"}},
            {"key": "ng.failure.kind", "value": {"stringValue": "judge_failed"}},
            {"key": "ng.failure.boundary", "value": {"stringValue": "resources_server"}},
            {"key": "ng.verify.masked", "value": {"boolValue": True}},
        ],
    }
    spans = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "ab" * 16, "events": [masked_event]}]}]}]}
    later = {**masked_event, "timeUnixNano": str(60_000_000_000 * 13)}
    later["attributes"] = [{"key": "ng.failure.id", "value": {"stringValue": "e2"}}, *masked_event["attributes"][1:]]
    more = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "cd" * 16, "events": [later]}]}]}]}

    def metrics(*points: dict) -> dict:
        outcomes = {"name": "ng.verify.outcomes", "sum": {"dataPoints": list(points)}}
        return {"resourceMetrics": [{"scopeMetrics": [{"metrics": [outcomes]}]}]}

    # A cumulative counter exported twice: its latest points are the totals (2 masked of 8).
    lines = [spans, metrics(_verify_point(3, False, "none")), more]
    lines.append(metrics(_verify_point(6, False, "none"), _verify_point(2, True, "judge_failed")))
    path = write(tmp_path / "telemetry.jsonl", lines)
    summary = summarise([path])
    assert (summary.rows, summary.traces, summary.masked, summary.verify_outcomes) == (0, 2, 2, 8)
    shown = Text.from_markup(headline(summary)).plain
    assert shown.startswith("2 traces · 2 failed") and "2 masked (25.0% of verify outcomes)" in shown
    assert "rows" not in shown
    from ng_otel.cli.report import charts_of

    line = charts_of(summary)["over-time"]["data"][0]
    assert line["y"] == [1, 0, 0, 1]  # the quiet minutes between are drawn as quiet


def test_a_row_saved_with_ng_otel_s_report_gets_its_servers_from_the_body_where_the_chains_agree(run):
    from ng_otel.contract.report import FailureReport
    from ng_otel.contract.rows import row_failures
    from ng_otel.gym.collection import report_row

    stock = failure_row(gym_body(*LANE_KEYS))
    report, servers = row_failures(stock)
    assert report is not None
    # The live run's report, saved beside the row (the ids are the live ones, not the row's).
    chain = [dict(record, event_id=f"live{index}") for index, record in enumerate(report.chain())]
    for effect, cause in itertools.pairwise(chain):
        effect["cause_id"] = cause["event_id"]
    saved = {**stock, **report_row(FailureReport({r["event_id"]: r for r in chain}, "live0"), {})}
    assert dict(row_failures(saved).servers) == {"live1": AGENT, "live2": AGENT, "live3": POLICY}
    chain[3]["boundary"] = "agent"  # not the chain the body names: no server is guessed
    disagreeing = {**stock, **report_row(FailureReport({r["event_id"]: r for r in chain}, "live0"), {})}
    assert dict(row_failures(disagreeing).servers) == {}
    assert list(servers.values()) == [AGENT, AGENT, POLICY]
