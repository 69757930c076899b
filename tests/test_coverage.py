"""A run's coverage account over generated NeMo Gym 0.7.0 runs whose composition is known.

Each rollout of a generated run is given a fate, and its rows are written as 0.7.0's rollout
collection writes them (``nemo_gym/rollout_collection.py``): every rollout in the
materialized inputs, a scored row in the main rows, one sidecar row per failed attempt. The
expected figures are counted from the fates, not from the rows.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from ng_otel.runs.coverage import (
    ACCOUNT_KEYS,
    DEFAULT_MIN_VALID,
    NO_AGENT,
    CoverageAccount,
    PromptGroup,
    RunFiles,
    read_run_coverage,
    run_coverage,
    run_files,
)
from ng_otel.runs.inputs import SkippedLine

ROLLOUTS = 50_000
REPEATS = 4  # rollouts per task: 12,500 prompt groups
AGENTS = ("simpleqa_simple_agent", "math_agent")
SEED = 25

# fate -> (its outcome in the account, whether it is a valid member of its prompt group)
FATES = {
    "healthy": ("measured", True),
    "masked": ("masked", False),
    "masked_the_old_way": ("masked", False),  # instance_config.mask_sample, as older Gym wrote it
    "failed_once": ("failed", False),
    "failed_three_times": ("failed", False),
    "judge_failed": ("failed", False),  # judge_failsafe's masked reply, routed to the sidecar
    "failed_then_succeeded": ("measured", True),
    "failed_then_masked": ("masked", False),
    "missing": ("unknown", False),  # hung or killed: no row anywhere
}
FATE_WEIGHTS = (60, 8, 2, 8, 3, 3, 8, 2, 6)


def agent_ref(agent: str) -> dict:
    return {"type": "responses_api_agents", "name": agent}


def sidecar_row(task: int, rollout: int, agent: str, attempt: int) -> dict:
    return {
        "_ng_failure_class": "agent_run_error",
        "_ng_failure_type": "ClientResponseError",
        "_ng_failure_message": f"500, message='Internal Server Error' (attempt {attempt})",
        "_ng_failure_http_status": 500,
        "_ng_failure_response_body": None,
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "agent_ref": agent_ref(agent),
        **({"_ng_attempt_index": attempt} if attempt else {}),
    }


def scored_row(task: int, rollout: int, agent: str, *, masked: bool = False, old_way: bool = False) -> dict:
    row = {"reward": 1.0, "_ng_task_index": task, "_ng_rollout_index": rollout, "agent_ref": agent_ref(agent)}
    if masked and old_way:
        row["instance_config"] = {"mask_sample": True}
    elif masked:
        row["mask_sample"] = True
    return row


class GeneratedRun:
    """A run of ``rollouts`` rollouts whose fates are drawn with ``seed``, as its three files'
    rows, and the figures counted from the fates."""

    def __init__(self, rollouts: int = ROLLOUTS, seed: int = SEED) -> None:
        chance = random.Random(seed)
        self.inputs: list[dict] = []
        self.rows: list[dict] = []
        self.failures: list[dict] = []
        self.fates: dict[tuple[int, int], tuple[str, str]] = {}  # (task, rollout) -> (agent, fate)
        for task in range(rollouts // REPEATS):
            agent = AGENTS[task % len(AGENTS)]
            for rollout in range(REPEATS):
                fate = chance.choices(list(FATES), FATE_WEIGHTS)[0]
                self.fates[task, rollout] = agent, fate
                self.inputs.append({"question": f"q{task}", "_ng_task_index": task, "_ng_rollout_index": rollout,
                                    "agent_ref": agent_ref(agent)})  # fmt: skip
                attempts = {"failed_three_times": 3, "failed_then_succeeded": 2, "failed_then_masked": 1}
                for attempt in range(attempts.get(fate, 1 if fate == "failed_once" else 0)):
                    self.failures.append(sidecar_row(task, rollout, agent, attempt))
                if fate == "judge_failed":
                    self.failures.append(
                        {**scored_row(task, rollout, agent, masked=True), "reward": 0.0,
                         "_ng_failure_class": "judge_failed", "_ng_failure_judge_error": "ClientResponseError: 503"}
                    )  # fmt: skip
                if fate in ("healthy", "failed_then_succeeded"):
                    self.rows.append(scored_row(task, rollout, agent))
                elif fate in ("masked", "failed_then_masked", "masked_the_old_way"):
                    self.rows.append(
                        scored_row(task, rollout, agent, masked=True, old_way=fate == "masked_the_old_way")
                    )
        # Rows land as rollouts finish, in no order; a rollout's own attempts stay in order.
        chance.shuffle(self.rows)

    def account(self, agent: str | None = None, *, with_inputs: bool = True) -> CoverageAccount:
        outcomes = Counter(FATES[fate][0] for a, fate in self.fates.values() if agent in (None, a))
        return CoverageAccount(
            expected=sum(outcomes.values()) if with_inputs else None,
            measured=outcomes["measured"],
            masked=outcomes["masked"],
            failed=outcomes["failed"],
            omitted=0,
            unknown=outcomes["unknown"] if with_inputs else None,
        )

    def unknown(self) -> tuple[tuple[int, int], ...]:
        return tuple(sorted(key for key, (_, fate) in self.fates.items() if fate == "missing"))

    def groups_below(self, min_valid: int, *, with_inputs: bool = True) -> tuple[PromptGroup, ...]:
        valid: Counter[int] = Counter()
        size: Counter[int] = Counter()
        for (task, _), (_, fate) in self.fates.items():
            if with_inputs or fate != "missing":  # without the inputs a group is what the files show
                size[task] += 1
                valid[task] += FATES[fate][1]
        return tuple(PromptGroup(task, valid[task], size[task]) for task in sorted(size) if valid[task] < min_valid)


@pytest.fixture(scope="module")
def run() -> GeneratedRun:
    return GeneratedRun()


def test_fifty_thousand_rollouts_give_exactly_their_account(run):
    coverage = run_coverage(run.rows, run.failures, run.inputs)
    assert coverage.total == run.account()
    assert coverage.total.expected == ROLLOUTS
    total = coverage.total
    assert total.expected == total.measured + total.masked + total.failed + total.omitted + total.unknown
    assert set(Counter(fate for _, fate in run.fates.values())) == set(FATES)  # every fate is in the run


def test_the_account_is_split_per_agent_and_the_agents_add_up_to_the_total(run):
    coverage = run_coverage(run.rows, run.failures, run.inputs)
    assert coverage.by_agent == {agent: run.account(agent) for agent in sorted(AGENTS)}
    for key in ACCOUNT_KEYS:
        assert sum(getattr(account, key) for account in coverage.by_agent.values()) == getattr(coverage.total, key)


def test_the_unknown_rollouts_are_listed_by_task_and_rollout_index(run):
    coverage = run_coverage(run.rows, run.failures, run.inputs)
    assert coverage.unknown_rollouts == run.unknown()
    assert len(coverage.unknown_rollouts) == coverage.total.unknown > 0


@pytest.mark.parametrize("min_valid", [DEFAULT_MIN_VALID, 1, 3, REPEATS + 1])
def test_prompt_groups_with_too_few_valid_members_are_counted_and_listed(run, min_valid):
    coverage = run_coverage(run.rows, run.failures, run.inputs, min_valid=min_valid)
    assert coverage.groups == ROLLOUTS // REPEATS
    assert coverage.groups_below_min_valid == run.groups_below(min_valid)
    assert coverage.min_valid == min_valid
    if min_valid > REPEATS:
        assert len(coverage.groups_below_min_valid) == coverage.groups


def test_without_the_inputs_expected_and_unknown_are_absent_not_guessed(run):
    coverage = run_coverage(run.rows, run.failures)
    assert coverage.total == run.account(with_inputs=False)
    assert coverage.total.to_dict()["expected"] is None and coverage.total.to_dict()["unknown"] is None
    assert coverage.by_agent == {agent: run.account(agent, with_inputs=False) for agent in sorted(AGENTS)}
    assert coverage.unknown_rollouts is None
    assert coverage.groups_below_min_valid == run.groups_below(DEFAULT_MIN_VALID, with_inputs=False)


def test_the_account_serializes_as_exactly_its_six_keys(run):
    data = run_coverage(run.rows, run.failures, run.inputs).to_dict()
    assert list(data["coverage"]) == ["expected", "measured", "masked", "failed", "omitted", "unknown"]
    assert all(list(account) == list(ACCOUNT_KEYS) for account in data["coverage_by_agent"].values())
    assert data["unknown_rollouts"] == [list(key) for key in run.unknown()]
    assert json.loads(json.dumps(data)) == data


def test_a_rollout_counts_once_whatever_its_attempts_and_a_scored_row_wins_in_any_order():
    agent = "a"
    rows = [scored_row(0, 0, agent), scored_row(0, 1, agent, masked=True), scored_row(0, 2, agent)]
    failures = [sidecar_row(0, r, agent, attempt) for r in range(4) for attempt in range(3)]
    inputs = [{"_ng_task_index": 0, "_ng_rollout_index": r, "agent_ref": agent_ref(agent)} for r in range(5)]
    for ordered in (rows + failures, failures + rows):  # a scored row wins before or after the failures
        coverage = run_coverage(
            [r for r in ordered if "_ng_failure_class" not in r],
            [r for r in ordered if "_ng_failure_class" in r],
            inputs,
        )
        assert coverage.total == CoverageAccount(5, 2, 1, 1, 0, 1)
        assert coverage.unknown_rollouts == ((0, 4),)
        assert coverage.groups_below_min_valid == ()  # two valid of five: enough


def test_among_failed_attempts_the_last_one_stands():
    inputs = [{"_ng_task_index": 0, "_ng_rollout_index": 0}]
    omitted_last = [sidecar_row(0, 0, "a", 0), {**sidecar_row(0, 0, "a", 1), "_ng_no_persist": True}]
    assert run_coverage([], omitted_last, inputs).total == CoverageAccount(1, 0, 0, 0, 1, 0)
    assert run_coverage([], omitted_last[::-1], inputs).total == CoverageAccount(1, 0, 0, 1, 0, 0)


def test_rows_outside_the_inputs_and_lines_that_name_no_rollout_are_counted_apart():
    inputs = [(1, {"_ng_task_index": 0, "_ng_rollout_index": 0}), (2, SkippedLine(2, "not JSON"))]
    rows = [
        (1, scored_row(0, 0, "a")),
        (2, scored_row(9, 9, "stray")),  # not in the inputs
        (3, {"reward": 1.0}),  # no indices
        (4, {"_ng_task_index": True, "_ng_rollout_index": 0}),  # a bool is no index
        (5, ["not", "a", "row"]),
    ]
    coverage = run_coverage(rows, [], inputs)
    assert coverage.total == CoverageAccount(1, 1, 0, 0, 0, 0)
    assert coverage.outside_inputs == 1
    assert coverage.rows_without_rollout == 4
    assert list(coverage.by_agent) == [NO_AGENT]  # the inputs' agent: the row named none


def test_string_indices_and_environment_servers_are_read_as_gym_reads_them():
    inputs = [
        {"_ng_task_index": "t1", "_ng_rollout_index": 0, "_ng_environment_server": "env"},
        {"_ng_task_index": 2, "_ng_rollout_index": 0, "agent_ref": agent_ref("a")},
    ]
    coverage = run_coverage([], [], inputs)
    assert coverage.unknown_rollouts == ((2, 0), ("t1", 0))  # numbers first, then names
    assert set(coverage.by_agent) == {"a", "env"}


def test_min_valid_must_be_a_count():
    with pytest.raises(ValueError, match="min_valid"):
        run_coverage([], min_valid=-1)


# -- the run's files -----------------------------------------------------------------------------


def write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_sidecar_and_inputs_are_found_beside_any_of_the_run_s_files_by_gym_s_naming(tmp_path):
    rows = write_lines(tmp_path / "rollouts.jsonl", [])
    failures = write_lines(tmp_path / "rollouts_failures.jsonl", [])
    inputs = write_lines(tmp_path / "rollouts_materialized_inputs.jsonl", [])
    for given in (rows, failures, inputs, str(rows)):
        assert run_files(given) == RunFiles(rows, failures, inputs)
    inputs.unlink()
    assert run_files(rows) == RunFiles(rows, failures, None)
    failures.unlink()
    assert run_files(rows) == RunFiles(rows, None, None)


def test_a_run_read_from_its_files_gives_the_same_account_and_tolerates_broken_lines(tmp_path):
    run = GeneratedRun(rollouts=2_000, seed=7)
    rows = write_lines(tmp_path / "rollouts.jsonl", run.rows)
    write_lines(tmp_path / "rollouts_failures.jsonl", run.failures)
    with open(write_lines(tmp_path / "rollouts_materialized_inputs.jsonl", run.inputs), "a") as stream:
        stream.write('{"_ng_task_index": 0, "_ng_rollo')  # cut off mid-write
    coverage = read_run_coverage(run_files(rows))
    assert (coverage.total, coverage.unknown_rollouts, coverage.rows_without_rollout) == (
        run.account(),
        run.unknown(),
        1,
    )
    without_inputs = read_run_coverage(RunFiles(rows, tmp_path / "rollouts_failures.jsonl", None))
    assert without_inputs.total == run.account(with_inputs=False)


def test_a_missing_main_rows_file_is_an_error_not_an_empty_run(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_run_coverage(RunFiles(tmp_path / "rollouts.jsonl", None, None))
