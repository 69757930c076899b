"""How much of a NeMo Gym run was measured: the coverage account of its saved files.

Gym 0.7.0's rollout collection (``nemo_gym/rollout_collection.py``) writes three files beside
each other (``nemo_gym/path_utils.py`` names them):

- ``<stem>_materialized_inputs.jsonl``: every task x rollout it meant to run, each with
  ``_ng_task_index`` and ``_ng_rollout_index``, written before the first dispatch;
- ``<stem>.jsonl``: the rollouts that were scored, some masked (``mask_sample``);
- ``<stem>_failures.jsonl``: one row per failed attempt (``_ng_failure_class``).

The account is ``expected = measured + masked + failed + omitted + unknown`` (Gym #2135,
#2611), per agent and in total. A rollout counts once, by its latest outcome as Gym's resume
rules it (``_load_from_cache``, ``_failure_rows_counted_as_zero``): a scored row ends a
rollout whatever attempts failed before or after it, so a success after failures is
measured; among failed attempts the last one in the files stands (``_latest_failure_rows``).
``omitted`` counts rows stamped ``_ng_no_persist``: 0.7.0 writes such a rollout (kill-shaped,
or never started by the dispatch budget) to no file at all, so from its files it is
``unknown``, and ``omitted`` stays 0. ``unknown`` is every expected rollout with no outcome
in any file, listed by (task index, rollout index): what makes a partial run read as
complete. Without the inputs file, ``expected`` and ``unknown`` are ``None``, never guessed.

Rollouts of one task form a prompt group; a group whose valid (measured, unmasked) members
are fewer than ``min_valid`` trains on too few votes (NeMo-RL #4061), and is listed.

Memory is flat in the rows read except one small entry per rollout (``bench/coverage.py``
measures it) and one per task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeGuard, Union

from ng_otel.contract.inner_errors import ROW_AGENT_REF, ROW_ENVIRONMENT_SERVER
from ng_otel.contract.rows import ROW_ROLLOUT_INDEX, ROW_TASK_INDEX, row_masked

DEFAULT_MIN_VALID: Final = 2
"""Fewest valid members a prompt group needs: GRPO's advantage needs two to compare."""
NO_AGENT: Final = "(no agent)"
"""The agent of a rollout that names neither ``agent_ref.name`` nor ``_ng_environment_server``."""
ACCOUNT_KEYS: Final = ("expected", "measured", "masked", "failed", "omitted", "unknown")

ROW_NO_PERSIST: Final = "_ng_no_persist"  # rollout_collection.NG_NO_PERSIST_KEY
FAILURES_SUFFIX: Final = "_failures"  # path_utils.failures_path_for
MATERIALIZED_SUFFIX: Final = "_materialized_inputs"  # path_utils.materialized_path_for
ROWS_SUFFIX: Final = ".jsonl"

Index = Union[int, str]
RolloutKey = tuple[Index, Index]

# A rollout's entry: its agent's number above the low bits, whether the inputs list it, and
# its latest outcome. One int per rollout keeps the per-rollout cost to its dict entry.
_OUTCOME_BITS: Final = 3
_OUTCOME_MASK: Final = (1 << _OUTCOME_BITS) - 1
_EXPECTED: Final = 1 << _OUTCOME_BITS
_AGENT_SHIFT: Final = _OUTCOME_BITS + 1
_NO_OUTCOME: Final = 0
_MEASURED: Final = 1
_MASKED: Final = 2
_FAILED: Final = 3
_OMITTED: Final = 4
INPUTS: Final = _EXPECTED  # the roles of a run's files, for CoverageReader
SCORED_ROWS: Final = _MEASURED
FAILED_ROWS: Final = _FAILED
_SCORED: Final = frozenset({_MEASURED, _MASKED})  # a main row's outcomes: they end the rollout
_INDEX_TYPES: Final = (int, str)  # exactly: a bool is no index
_NUMBERED_LINE: Final = 2  # (line number, value)
_TALLY_PLACE: Final = {_MEASURED: 1, _MASKED: 2, _FAILED: 3, _OMITTED: 4, _NO_OUTCOME: 5}  # in ACCOUNT_KEYS


@dataclass(frozen=True, slots=True)
class CoverageAccount:
    """``expected = measured + masked + failed + omitted + unknown`` (``expected`` and
    ``unknown`` ``None`` without the inputs)."""

    expected: int | None
    measured: int
    masked: int
    failed: int
    omitted: int
    unknown: int | None

    def to_dict(self) -> dict[str, int | None]:
        """Exactly the six keys of ``ACCOUNT_KEYS``."""
        return {key: getattr(self, key) for key in ACCOUNT_KEYS}


@dataclass(frozen=True, slots=True)
class PromptGroup:
    """The rollouts of one task: how many are valid (measured, unmasked) of how many."""

    task_index: Index
    valid: int
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"task_index": self.task_index, "valid": self.valid, "size": self.size}


@dataclass(frozen=True, slots=True)
class RunCoverage:
    """A run's coverage: the account in total and per agent, the rollouts no file accounts
    for, and the prompt groups left with too few valid members."""

    total: CoverageAccount
    by_agent: Mapping[str, CoverageAccount]
    unknown_rollouts: tuple[RolloutKey, ...] | None  # sorted; None without the inputs
    groups: int  # prompt groups counted (tasks expected, or seen without the inputs)
    groups_below_min_valid: tuple[PromptGroup, ...]  # sorted by task index
    min_valid: int
    outside_inputs: int  # rollouts with an outcome that the inputs never listed: in no account
    rows_without_rollout: int  # items that are no row, or name no task and rollout index: in no account

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``coverage`` (the six keys), ``coverage_by_agent``, ``unknown_rollouts``
        (``[task, rollout]`` pairs, or ``None``) and ``groups_below_min_valid``."""
        return {
            "coverage": self.total.to_dict(),
            "coverage_by_agent": {agent: account.to_dict() for agent, account in self.by_agent.items()},
            "unknown_rollouts": None if self.unknown_rollouts is None else [list(key) for key in self.unknown_rollouts],
            "groups": self.groups,
            "groups_below_min_valid": [group.to_dict() for group in self.groups_below_min_valid],
            "min_valid": self.min_valid,
            "outside_inputs": self.outside_inputs,
            "rows_without_rollout": self.rows_without_rollout,
        }


def rollout_key(row: Mapping[str, Any]) -> RolloutKey | None:
    """(``_ng_task_index``, ``_ng_rollout_index``), how Gym keys a rollout, or ``None`` when
    the row has no such pair (an index is an int or a string; a bool is neither)."""
    task = row.get(ROW_TASK_INDEX)
    rollout = row.get(ROW_ROLLOUT_INDEX)
    if _is_index(task) and _is_index(rollout):
        return task, rollout
    return None


def _is_index(value: object) -> TypeGuard[Index]:
    return type(value) is int or type(value) is str  # not a bool, not a subclass


def rollout_agent(row: Mapping[str, Any]) -> str:
    """The agent a rollout ran on, as Gym's ``_routing_identity`` reads it: ``agent_ref.name``,
    else the environment server a materialized taskset row names, else ``NO_AGENT``."""
    agent_ref = row.get(ROW_AGENT_REF)
    name = agent_ref.get("name") if isinstance(agent_ref, dict) else None  # decoded JSON: a dict
    if isinstance(name, str) and name:
        return name
    server = row.get(ROW_ENVIRONMENT_SERVER)
    return server if isinstance(server, str) and server else NO_AGENT


def run_coverage(
    rows: Iterable[object],
    failures: Iterable[object] = (),
    inputs: Iterable[object] | None = None,
    *,
    min_valid: int = DEFAULT_MIN_VALID,
) -> RunCoverage:
    """The coverage of a run from its main rows, its failures sidecar rows and (when given) its
    materialized inputs. Each iterable yields decoded rows, or ``(line number, row)`` pairs as
    ``read_json_lines`` does; anything that is not a row (a ``SkippedLine``) counts in
    ``rows_without_rollout``. Each is read once, in order: inputs first."""
    if type(min_valid) is not int or min_valid < 0:
        raise ValueError("min_valid: must be an int >= 0")
    state = CoverageReader()
    if inputs is not None:
        state.read(inputs, _EXPECTED)
    state.read(rows, _MEASURED)
    state.read(failures, _FAILED)
    return state.account(has_inputs=inputs is not None, min_valid=min_valid)


class CoverageReader:
    """A run's coverage, read a row at a time (``run_coverage`` reads whole files)."""

    __slots__ = ("agent_ids", "agents", "entries", "rows_without_rollout")

    def __init__(self) -> None:
        self.entries: dict[RolloutKey, int] = {}
        self.agents: list[str] = []
        self.agent_ids: dict[str, int] = {}
        self.rows_without_rollout = 0

    def _agent_bits(self, row: Mapping[str, Any]) -> int:
        name = rollout_agent(row)
        number = self.agent_ids.get(name)
        if number is None:
            number = self.agent_ids[name] = len(self.agents)
            self.agents.append(name)
        return number << _AGENT_SHIFT

    def read(self, items: Iterable[object], role: int) -> None:
        """Account for every row of one file: ``role`` is ``INPUTS`` for the materialized
        inputs, ``SCORED_ROWS`` for the main rows (masked when the row says so),
        ``FAILED_ROWS`` for the sidecar."""
        add = self.add
        for item in items:
            add(item, role)

    def add(self, item: object, role: int, masked: bool | None = None) -> None:
        """Account for one row (or ``(line number, row)``) of a file of ``role``; ``masked``:
        whether a scored row is masked, when the caller has read it already."""
        if type(item) is tuple and len(item) == _NUMBERED_LINE:  # (line number, value): read_json_lines'
            item = item[1]
        if type(item) is not dict:
            self.rows_without_rollout += 1
            return
        task, rollout = item.get(ROW_TASK_INDEX), item.get(ROW_ROLLOUT_INDEX)
        if type(task) not in _INDEX_TYPES or type(rollout) not in _INDEX_TYPES:
            self.rows_without_rollout += 1
            return
        entries = self.entries
        key: RolloutKey = (task, rollout)  # type: ignore[assignment]  # checked just above
        entry = entries.get(key)
        if role == _EXPECTED:  # in whichever order the files are read: an outcome read first is kept
            entries[key] = (entry if entry is not None else self._agent_bits(item)) | _EXPECTED
            return
        if item.get(ROW_NO_PERSIST) is True:
            outcome = _OMITTED
        elif role == _MEASURED and (row_masked(item) if masked is None else masked):
            outcome = _MASKED
        else:
            outcome = role
        if entry is None:  # not in the inputs (or none were given): its agent from this row
            entries[key] = self._agent_bits(item) | outcome
        elif outcome in _SCORED or entry & _OUTCOME_MASK not in _SCORED:
            # A scored row ends the rollout: Gym never retries it, and never counts a failed
            # attempt of a rollout that was also scored. Otherwise the later row stands.
            entries[key] = (entry & ~_OUTCOME_MASK) | outcome

    def account(self, *, has_inputs: bool, min_valid: int) -> RunCoverage:
        tallies = [[0] * len(ACCOUNT_KEYS) for _ in self.agents]
        groups: dict[Index, list[int]] = {}  # task -> [valid, size]
        unknown: list[RolloutKey] = []
        outside = 0
        for key, entry in self.entries.items():
            if has_inputs and not entry & _EXPECTED:
                outside += 1
                continue
            outcome = entry & _OUTCOME_MASK
            tally = tallies[entry >> _AGENT_SHIFT]
            tally[0] += 1
            tally[_TALLY_PLACE[outcome]] += 1
            if outcome == _NO_OUTCOME:
                unknown.append(key)
            group = groups.get(key[0])
            if group is None:
                group = groups[key[0]] = [0, 0]
            group[0] += outcome == _MEASURED
            group[1] += 1
        by_agent = {
            name: _account(tally, has_inputs)
            for name, tally in sorted(zip(self.agents, tallies, strict=True))
            if tally[0]  # an agent only rows outside the inputs named: in no account
        }
        total = [sum(column) for column in zip(*tallies, strict=True)] if tallies else [0] * len(ACCOUNT_KEYS)
        below = [PromptGroup(task, valid, size) for task, (valid, size) in groups.items() if valid < min_valid]
        return RunCoverage(
            total=_account(total, has_inputs),
            by_agent=by_agent,
            unknown_rollouts=tuple(sorted(unknown, key=_key_order)) if has_inputs else None,
            groups=len(groups),
            groups_below_min_valid=tuple(sorted(below, key=lambda group: _index_order(group.task_index))),
            min_valid=min_valid,
            outside_inputs=outside,
            rows_without_rollout=self.rows_without_rollout,
        )


def _account(tally: list[int], has_inputs: bool) -> CoverageAccount:
    expected, measured, masked, failed, omitted, unknown = tally
    return CoverageAccount(
        expected if has_inputs else None, measured, masked, failed, omitted, unknown if has_inputs else None
    )


def _index_order(index: Index) -> tuple[bool, Any]:
    return isinstance(index, str), index  # numbers first, then names: never int against str


def _key_order(key: RolloutKey) -> tuple[tuple[bool, Any], tuple[bool, Any]]:
    return _index_order(key[0]), _index_order(key[1])


# -- the run's files, by Gym's naming -----------------------------------------------------------


class RunFiles(NamedTuple):
    """A run's three files; ``failures`` and ``inputs`` are ``None`` when absent."""

    rows: Path
    failures: Path | None
    inputs: Path | None


def failures_path_for(rows: Path) -> Path:
    """``results/rollouts.jsonl`` -> ``results/rollouts_failures.jsonl`` (Gym's ``failures_path_for``)."""
    return rows.with_name(rows.stem + FAILURES_SUFFIX + ROWS_SUFFIX)


def materialized_path_for(rows: Path) -> Path:
    """``results/rollouts.jsonl`` -> ``results/rollouts_materialized_inputs.jsonl``."""
    return rows.with_name(rows.stem + MATERIALIZED_SUFFIX + ROWS_SUFFIX)


def run_files(path: Path | str) -> RunFiles:
    """The run ``path`` belongs to: given its main rows, its sidecar or its materialized inputs,
    the three files by Gym's naming, those that exist."""
    given = Path(path)
    rows = given
    for suffix in (FAILURES_SUFFIX, MATERIALIZED_SUFFIX):
        if given.name.endswith(suffix + ROWS_SUFFIX):
            rows = given.with_name(given.name[: -len(suffix + ROWS_SUFFIX)] + ROWS_SUFFIX)
    failures, inputs = failures_path_for(rows), materialized_path_for(rows)
    return RunFiles(rows, failures if failures.is_file() else None, inputs if inputs.is_file() else None)


def read_run_coverage(files: RunFiles, *, min_valid: int = DEFAULT_MIN_VALID) -> RunCoverage:
    """``run_coverage`` of ``files``, read a line at a time. Raises ``OSError`` for a file that
    is missing or cannot be read (``run_files`` gives ``None`` for a neighbour that is absent)."""
    from ng_otel.runs.inputs import read_json_lines  # imported here: coverage also reads rows already decoded

    def lines(path: Path) -> Iterable[object]:
        with path.open("rb") as stream:
            yield from read_json_lines(stream)

    files.rows.open("rb").close()  # a missing main file is refused before anything is read
    failures = lines(files.failures) if files.failures is not None else ()
    inputs = lines(files.inputs) if files.inputs is not None else None
    return run_coverage(lines(files.rows), failures, inputs, min_valid=min_valid)
