"""What failed, where, and why, over saved rows and OTLP JSON lines: the figures of
``ng-otel summary`` and ``ng-otel report``, as data.

Rows of both formats (Gym Main's saved reports, NeMo Gym 0.7.0's failure sidecar and judge
rows) are read with ``ng_otel.contract.rows``, a 0.7.0 row as the chain of servers its nested
error body names; OTLP JSON lines (what ``ng-otel receive`` and the Collector's file exporter
write) from their ``ng.failure`` span events and log records, and their verify outcomes from
the ``ng.verify.outcomes`` metric. Memory stays flat on rows of any number, except one small
entry per rollout for a run's coverage; OTLP input keeps one small entry per failure event,
because a cause may be anywhere in the file.

Given a run's rows, the files Gym writes beside them are read too (``ng_otel.runs.coverage``
names them): the failures sidecar as rows, the materialized inputs for the coverage account.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final, TypeVar

from ng_otel.contract.classify import classify_failure
from ng_otel.contract.inner_errors import body_names_servers
from ng_otel.contract.rows import (
    ROW_FAILURE_CLASS,
    class_row_failure,
    class_row_reason,
    read_row_failures,
    row_masked,
    row_terminal,
)
from ng_otel.otel import names
from ng_otel.runs.coverage import (
    ACCOUNT_KEYS,
    DEFAULT_MIN_VALID,
    FAILED_ROWS,
    FAILURES_SUFFIX,
    INPUTS,
    MATERIALIZED_SUFFIX,
    ROWS_SUFFIX,
    SCORED_ROWS,
    CoverageReader,
    RunCoverage,
    run_files,
)
from ng_otel.runs.inputs import SkippedLine, SkippedLines, Wrap, file_lines, formatted_lines
from ng_otel.runs.otlp import NO_TRACE_IDS, otlp_counter_points, otlp_line_failures

SUMMARY_KEYS: Final = (
    "rows",
    "traces",
    "failed_rows",
    "events",
    "by_kind",
    "by_boundary",
    "by_server",
    "by_class",
    "root_kinds",
    "root_causes",
    "masked",
    "verify_outcomes",
    "retry_outcomes",
    "rollout_outcomes",
    "skipped",
    "coverage",
    "coverage_by_agent",
    "unknown_rollouts",
    "groups_below_min_valid",
)
MAX_DISTINCT: Final = 1000
"""Distinct values one figure keeps (kinds, chains, stages); past it new ones count under
``_other``, so a file of endless distinct kinds cannot grow memory."""
MAX_CHAIN_HOPS: Final = 64  # a chain shape longer than this is cut: a shape is for grouping
MAX_ROOT_REASON: Final = 160  # a root cause's reason: its first line, cut to this, for ranking
MAX_LISTED_ROLLOUTS: Final = 1000  # unknown rollouts and short prompt groups listed; all are counted
NO_STAGE: Final = "(none)"
NO_SERVER: Final = "(unnamed)"
"""The server of an event that no row names (collection's own, Gym Main's saved records)."""

Hop = tuple[str, str, str]  # kind, boundary, server
Chain = tuple[Hop, ...]  # from the effect down to its root cause
RootCause = tuple[str, str, str]  # kind, server, the reason's first line
RowTally = tuple[str, str, str | None, int | None, bool, str]  # kind, boundary, stage, status, terminal, server
_Figure = tuple[str, str, str | None, str, str]  # kind, boundary, stage, class, server


class _Bounded(Counter[Any]):
    """A counter that folds new keys into ``_other`` once it holds ``MAX_DISTINCT``."""

    def add(self, key: Any, count: int = 1) -> None:
        if key not in self and len(self) >= MAX_DISTINCT:
            key = names.OTHER_KIND
        self[key] += count


_Key = TypeVar("_Key")


_NONE_NAMED: Final[dict[str, str]] = {}


def _held(table: dict[_Key, int], key: _Key) -> bool:
    """Count ``key`` in ``table`` when it is there or there is room; ``False`` when the table
    is full and the caller must fold the count into the figures at once."""
    count = table.get(key)  # one lookup for the usual key, one held already
    if count is not None:
        table[key] = count + 1
    elif len(table) < MAX_DISTINCT:
        table[key] = 1
    else:
        return False
    return True


def reason_line(reason: str) -> str:
    """A reason as one line for ranking: its first non-blank line, cut to ``MAX_ROOT_REASON``."""
    head = reason[: MAX_ROOT_REASON * 4].strip()
    line = head.split("\n", 1)[0].strip()
    return line if len(line) <= MAX_ROOT_REASON else line[: MAX_ROOT_REASON - 1] + "\N{HORIZONTAL ELLIPSIS}"


class Summary:
    """The figures of one or more files, added line by line."""

    def __init__(self) -> None:
        self.rows = self.traces = self.failed_rows = self.events = self.masked = 0
        self.by_kind, self.by_boundary, self.by_class = _Bounded(), _Bounded(), _Bounded()
        self.by_server = _Bounded()
        self.root_kinds, self.by_stage, self.kind_boundary = _Bounded(), _Bounded(), _Bounded()
        self.root_causes = _Bounded()  # (kind, server, reason line) -> failed rows
        self.chains = _Bounded()
        self.over_time = _Bounded()  # unix minute -> events, for OTLP input (rows carry no time)
        self.files: list[str] = []
        self.found_beside: list[str] = []  # files read because Gym writes them beside a named one
        self.coverage: dict[str, RunCoverage] = {}  # run (its main rows' path) -> its account
        self._skipped = SkippedLines()
        # id -> kind, boundary, cause, recovered, server, reason line
        self._otlp: dict[str, tuple[str, str, str | None, bool, str, str]] = {}
        self._traces: set[str] = set()
        # (metric, series) -> its latest total: verify, retry and rollout outcomes from OTLP metrics
        self._counters: dict[tuple[str, tuple[Any, ...]], int] = {}
        # Outcomes ng_otel's own JSON lines said, one a line (OpenTelemetry off: NG_OTEL_EXPORT)
        self._line_outcomes: dict[str, Counter[str]] = {names.LINE_RETRY: Counter(), names.LINE_ROLLOUT: Counter()}
        # Hot path: one dict entry per distinct event of a row (RowTally: classified once, by
        # finish), per distinct classified OTLP event, and per distinct (chain, root cause);
        # finish() folds them into the figures.
        self._row_tallies: dict[RowTally, int] = {}
        self._combos: dict[_Figure, int] = {}
        self._rooted: dict[tuple[Chain, RootCause], int] = {}

    # -- adding -------------------------------------------------------------------------

    def add_file(
        self, path: Path, wrap: Wrap | None = None, coverage: tuple[CoverageReader, int] | None = None
    ) -> None:
        """Read one file (rows or OTLP JSON lines, as its first JSON object says); each row
        is also accounted for in ``coverage`` (a run's reader and the file's role) when given."""
        where = str(path)
        self.files.append(where)
        add_line, account = self.add_line, coverage[0].add if coverage is not None else None
        role = coverage[1] if coverage is not None else 0
        for item in formatted_lines(file_lines(path, wrap)):
            if isinstance(item, SkippedLine):
                self.skip(where, item)
            elif item[2]:
                self.add_otlp(item[1], item[0], where)
            else:
                masked = add_line(item[1], item[0], where)
                if account is not None and masked is not None:
                    account(item[1], role, masked)

    @property
    def skipped(self) -> int:
        """Lines that were not rows or OTLP JSON lines of the file's format."""
        return self._skipped.count

    @property
    def skipped_lines(self) -> list[tuple[str, SkippedLine]]:
        """The first ``MAX_LISTED_SKIPPED`` skipped lines, with the file each is in."""
        return self._skipped.listed

    @property
    def verify_outcomes(self) -> int | None:
        """Verify outcomes the OTLP metrics counted (``ng.verify.outcomes``), ``None`` without any."""
        totals = [total for (metric, _), total in self._counters.items() if metric == names.VERIFY_METRIC]
        return sum(totals) if totals else None

    def outcomes(self, metric: str, label: str, line: str) -> dict[str, int]:
        """The counts of ``metric`` by its ``label`` (the OTLP metrics' latest totals), or, in
        ng_otel's own JSON lines, one a ``line`` record, most frequent first."""
        counts: Counter[str] = Counter(self._line_outcomes[line])
        for (name, series), total in self._counters.items():
            if name == metric:
                counts[str(dict(series[1]).get(label, names.OTHER_KIND))] += total
        return dict(counts.most_common())

    @property
    def retry_outcomes(self) -> dict[str, int]:
        """Operations that may retry, by outcome (``ng.retry.outcomes`` / ``ng.retry`` lines)."""
        return self.outcomes(names.RETRY_METRIC, names.RETRY_OUTCOME, names.LINE_RETRY)

    @property
    def rollout_outcomes(self) -> dict[str, int]:
        """Rollouts by the outcome collection gave them (``ng.rollout.outcomes`` / ``ng.rollout`` lines)."""
        return self.outcomes(names.ROLLOUT_METRIC, names.ROLLOUT_OUTCOME, names.LINE_ROLLOUT)

    def skip(self, where: str, line: SkippedLine) -> None:
        """Count ``line`` of the file ``where`` as skipped (listed among the first few)."""
        self._skipped.add(line, where)

    def add_line(self, value: Any, number: int, where: str = "") -> bool | None:
        """One decoded line of saved rows: whether its sample is masked, ``None`` when it is
        no row (a skipped line)."""
        try:
            # A 0.7.0 failure row whose body names no server is counted from its keys: its
            # derived event id is not needed. One that names servers is read as its chain.
            failure = None
            if isinstance(value, dict) and ROW_FAILURE_CLASS in value:  # most rows hold none: no call
                failure = class_row_failure(value)
                if failure is not None and body_names_servers(value):
                    failure = None
            report, servers = read_row_failures(value) if failure is None else (None, None)
        except ValueError as error:
            self.skip(where, SkippedLine(number, str(error)))
            return None
        self.rows += 1
        masked = row_masked(value)
        if masked:
            self.masked += 1
        if failure is not None:
            self.failed_rows += 1
            kind, boundary = failure.kind, failure.boundary
            self._tally((kind, boundary, failure.stage, failure.http_status, row_terminal(value) is True, NO_SERVER))
            reason = class_row_reason(value, failure)[:MAX_ROOT_REASON]
            self._root(((kind, boundary, NO_SERVER),), (kind, NO_SERVER, reason))
            return masked
        if report is None:
            return masked
        # _ng_failure_terminal makes the row's own failure DATA (another attempt would not help).
        terminal_id = report.failure_id if row_terminal(value) else None
        tallies = self._row_tallies
        held = tallies.get
        server_of = (servers or _NONE_NAMED).get  # a C call either way: no branch per event
        events = report.events
        for event_id, record in events.items():
            tally = (
                record["failure_kind"],
                record["boundary"],
                record.get("stage"),
                record.get("http_status"),
                event_id == terminal_id,
                server_of(event_id, NO_SERVER),
            )
            count = held(tally)  # one lookup for a tally held already, the usual one
            if count is not None:
                tallies[tally] = count + 1
            else:
                self._tally(tally)
        if report.failure_id is not None:
            self.failed_rows += 1
            chain: list[Hop] = []
            event_id = report.failure_id
            while True:  # at most every event once: a report's causes form no cycle
                record = events[event_id]
                server = server_of(event_id, NO_SERVER)
                chain.append((record["failure_kind"], record["boundary"], server))
                cause = record.get("cause_id")
                if cause is None:
                    break
                event_id = cause
            root = (record["failure_kind"], server, record["failure_reason"][:MAX_ROOT_REASON])
            self._root(tuple(chain[:MAX_CHAIN_HOPS]), root)
        return masked

    def _tally(self, tally: RowTally) -> None:
        if not _held(self._row_tallies, tally):
            self._fold_row_tally(tally, 1)

    def _fold_row_tally(self, tally: RowTally, count: int) -> None:
        kind, boundary, stage, status, terminal, server = tally
        self._fold((kind, boundary, stage, classify_failure(kind, status, terminal=terminal).value, server), count)

    def _root(self, chain: Chain, root: RootCause) -> None:
        """Count a failed row's chain and root cause (its reason cut, not yet made one line:
        ``finish`` does that once per distinct cause, not once per row)."""
        if not _held(self._rooted, (chain, root)):
            self.chains.add(names.OTHER_KIND)
            self.root_kinds.add(root[0])
            self.root_causes.add((root[0], root[1], reason_line(root[2])))

    def _count(self, figure: _Figure) -> None:
        if not _held(self._combos, figure):
            self._fold(figure, 1)

    def _fold(self, figure: _Figure, count: int) -> None:
        kind, boundary, stage, failure_class, server = figure
        self.events += count
        self.by_kind.add(kind, count)
        self.by_boundary.add(boundary, count)
        self.by_server.add(server, count)
        self.by_class.add(failure_class, count)
        self.by_stage.add(stage or NO_STAGE, count)
        self.kind_boundary.add((kind, boundary), count)

    def add_otlp(self, value: Any, number: int, where: str = "") -> None:
        """One OTLP JSON line: each ``ng.failure`` event once, by id; its traces; its verify
        outcomes' latest totals."""
        record = value.get(names.LINE_RECORD)
        if record in self._line_outcomes:  # one of ng_otel's retry or rollout outcome lines
            label = names.RETRY_OUTCOME if record == names.LINE_RETRY else names.ROLLOUT_OUTCOME
            outcome = value.get(label)
            counted = self._line_outcomes[record]
            if isinstance(outcome, str) and (outcome in counted or len(counted) < MAX_DISTINCT):
                counted[outcome] += 1
            return
        counters = self._counters
        for metric, series, total in otlp_counter_points(value):
            key = (metric, series)
            if total > counters.get(key, -1) and (key in counters or len(counters) < MAX_DISTINCT):
                counters[key] = total  # a cumulative sum: its latest point is its total
        failures, skipped = otlp_line_failures(number, value, self._traces)
        if skipped is not None:
            self.skip(where, skipped)
        for trace_id, attributes, time in failures:
            event_id = str(attributes[names.ID])
            if event_id in self._otlp:
                continue  # the same event as a span event and as a log record
            if trace_id in NO_TRACE_IDS:
                self.traces += 1  # an event outside any trace is a trace of its own
            else:
                self._traces.add(trace_id)  # a log record's trace is a trace too (spans add theirs)
            kind, boundary = str(attributes[names.KIND]), str(attributes[names.BOUNDARY])
            status = attributes.get(names.HTTP_STATUS)
            failure_class = attributes.get(names.CLASS)
            if failure_class not in ("infra", "data"):
                failure_class = classify_failure(kind, status if isinstance(status, int) else None).value
            stage = attributes.get(names.STAGE)
            server = str(attributes.get("service.name") or NO_SERVER)
            self._count((kind, boundary, str(stage) if stage is not None else None, str(failure_class), server))
            if attributes.get(names.VERIFY_MASKED) is True:
                self.masked += 1
            cause = attributes.get(names.CAUSE_ID)
            cause = cause if isinstance(cause, str) else None  # as show reads it: a list is no cause
            recovered = attributes.get(names.RECOVERED) is True
            reason = reason_line(str(attributes.get(names.REASON, "")))  # kept per event: made one line once
            self._otlp[event_id] = (kind, boundary, cause, recovered, server, reason)
            if time:
                self.over_time.add(time // 60_000_000_000)

    def finish(self) -> Summary:
        """Resolve OTLP chains (a cause may come after its effect, or in another trace)."""
        self.traces += len(self._traces - NO_TRACE_IDS)
        self._traces.clear()
        causes = {entry[2] for entry in self._otlp.values() if entry[2] is not None}
        reached: set[str] = set()
        for event_id, entry in self._otlp.items():
            if event_id not in causes:  # a top: the effect nothing else names as its cause
                # A recovered top is no failed reply, but its causes are reached all the same.
                self._otlp_chain(event_id, reached, counted=not entry[3])
        for event_id in self._otlp:
            if event_id not in reached:  # on a cycle of causes that no top leads into
                self._otlp_chain(event_id, reached, counted=True)  # one failed chain a cycle
        self._otlp.clear()
        for tally, count in self._row_tallies.items():
            self._fold_row_tally(tally, count)
        self._row_tallies.clear()
        for figure, count in self._combos.items():
            self._fold(figure, count)
        self._combos.clear()
        for (shape, (kind, server, reason)), count in self._rooted.items():
            self.chains.add(shape, count)
            self.root_kinds.add(kind, count)
            self.root_causes.add((kind, server, reason_line(reason)), count)
        self._rooted.clear()
        return self

    def _otlp_chain(self, event_id: str, reached: set[str], *, counted: bool) -> None:
        """Follow one OTLP event's causes down to its root (stopping where they loop), marking
        each event reached; a counted chain is one failed chain."""
        kind, boundary, cause, _, server, reason = self._otlp[event_id]
        chain: list[Hop] = [(kind, boundary, server)]
        reached.add(event_id)
        seen = {event_id}
        while cause is not None and cause in self._otlp and cause not in seen:
            seen.add(cause)
            reached.add(cause)
            kind, boundary, cause, _, server, reason = self._otlp[cause]
            if len(chain) < MAX_CHAIN_HOPS:
                chain.append((kind, boundary, server))
        if counted:
            self.failed_rows += 1
            self.root_kinds.add(kind)
            self.root_causes.add((kind, server, reason))
            self.chains.add(tuple(chain))

    # -- output -------------------------------------------------------------------------

    def coverage_total(self) -> dict[str, Any] | None:
        """The coverage of every run read, added up: ``coverage`` (the six keys; ``expected``
        and ``unknown`` ``None`` unless every run had its inputs), ``coverage_by_agent``,
        ``unknown_rollouts`` and ``groups_below_min_valid`` (each listed with its run, the first
        ``MAX_LISTED_ROLLOUTS``); ``None`` when no run's rows were read."""
        if not self.coverage:
            return None
        runs = list(self.coverage.items())
        every_input = all(run.total.expected is not None for _, run in runs)
        total: Counter[str] = Counter()
        by_agent: dict[str, Counter[str]] = {}
        unknown: list[dict[str, Any]] = []
        short: list[dict[str, Any]] = []
        for where, run in runs:
            total.update({key: value for key, value in run.total.to_dict().items() if value is not None})
            for agent, agent_account in run.by_agent.items():
                by_agent.setdefault(agent, Counter()).update(
                    {key: value for key, value in agent_account.to_dict().items() if value is not None}
                )
            for task, rollout in run.unknown_rollouts or ():
                if len(unknown) < MAX_LISTED_ROLLOUTS:
                    unknown.append({"run": where, "task_index": task, "rollout_index": rollout})
            for group in run.groups_below_min_valid:
                if len(short) < MAX_LISTED_ROLLOUTS:
                    short.append({"run": where, **group.to_dict()})

        def account(counts: Counter[str]) -> dict[str, int | None]:
            whole: dict[str, int | None] = {key: counts[key] for key in ACCOUNT_KEYS}
            if not every_input:
                whole["expected"] = whole["unknown"] = None  # never guessed
            return whole

        return {
            "coverage": account(total),
            "coverage_by_agent": {agent: account(counts) for agent, counts in sorted(by_agent.items())},
            "unknown_rollouts": unknown if every_input else None,
            "unknown_count": sum(len(run.unknown_rollouts or ()) for _, run in runs),
            "groups_below_min_valid": short,
            "groups_below_count": sum(len(run.groups_below_min_valid) for _, run in runs),
            "min_valid": runs[0][1].min_valid,
        }

    def to_json(self) -> dict[str, Any]:
        """Exactly ``SUMMARY_KEYS``; each breakdown most frequent first."""
        coverage = self.coverage_total() or {}
        return {
            "rows": self.rows,
            "traces": self.traces,
            "failed_rows": self.failed_rows,
            "events": self.events,
            "by_kind": dict(self.by_kind.most_common()),
            "by_boundary": dict(self.by_boundary.most_common()),
            "by_server": dict(self.by_server.most_common()),
            "by_class": dict(self.by_class.most_common()),
            "root_kinds": dict(self.root_kinds.most_common()),
            "root_causes": [
                {"failure_kind": kind, "server": server, "reason": reason, "count": count}
                for (kind, server, reason), count in self.top_root_causes(len(self.root_causes))
            ],
            "masked": self.masked,
            "verify_outcomes": self.verify_outcomes,
            "retry_outcomes": self.retry_outcomes,
            "rollout_outcomes": self.rollout_outcomes,
            "skipped": self.skipped,
            "coverage": coverage.get("coverage"),
            "coverage_by_agent": coverage.get("coverage_by_agent"),
            "unknown_rollouts": coverage.get("unknown_rollouts"),
            "groups_below_min_valid": coverage.get("groups_below_min_valid"),
        }

    def top_chains(self, count: int) -> list[tuple[Chain, int]]:
        """The ``count`` most frequent chain shapes, (kind, boundary, server) hops effect first."""
        return [(chain, n) for chain, n in self.chains.most_common(count) if chain != names.OTHER_KIND]

    def top_root_causes(self, count: int) -> list[tuple[RootCause, int]]:
        """The ``count`` most frequent root causes, (kind, server, reason line), by failed rows."""
        return [(root, n) for root, n in self.root_causes.most_common(count) if root != names.OTHER_KIND]


def summarise(
    paths: Iterable[Path],
    wrap: Callable[[Path], Wrap | None] | None = None,
    *,
    min_valid: int = DEFAULT_MIN_VALID,
) -> Summary:
    """The figures of ``paths`` together, with the coverage of each Gym run among them.

    A run's main rows bring its failures sidecar (read as rows, in ``found_beside`` when not
    named) and its materialized inputs (for the coverage account only, never as rows); a
    sidecar or an inputs file named alone brings its run the same way. A file named twice (a
    glob and its own name, say) is read once, so its rows are not counted twice. ``wrap(path)``:
    how to read each (a progress bar)."""
    summary = Summary()
    read: set[tuple[int, int]] = set()
    runs: dict[Path, CoverageReader] = {}  # a run's main rows -> its account's reader

    def first_time(path: Path) -> bool:
        try:
            status = path.stat()
        except OSError:
            return True  # reading it says what is wrong
        key = (status.st_dev, status.st_ino)
        if key in read:
            return False
        read.add(key)
        return True

    def add(path: Path, coverage: tuple[CoverageReader, int] | None) -> None:
        if first_time(path):
            summary.add_file(path, wrap(path) if wrap is not None else None, coverage)

    named = list(paths)
    for path in named:
        files = run_files(path) if path.name.endswith(ROWS_SUFFIX) else None
        if files is None:
            add(path, None)
            continue
        reader = runs.setdefault(files.rows, CoverageReader())
        if not path.name.endswith(MATERIALIZED_SUFFIX + ROWS_SUFFIX):  # inputs are read below, never as rows
            role = FAILED_ROWS if path.name.endswith(FAILURES_SUFFIX + ROWS_SUFFIX) else SCORED_ROWS
            add(path, (reader, role))
    for rows, reader in runs.items():
        files = run_files(rows)
        for beside, role in ((files.rows, SCORED_ROWS), (files.failures, FAILED_ROWS)):
            if beside is not None and beside.is_file() and first_time(beside):
                summary.found_beside.append(str(beside))
                summary.add_file(beside, wrap(beside) if wrap is not None else None, (reader, role))
        has_inputs = files.inputs is not None
        if files.inputs is not None:
            for _, value in file_lines(files.inputs):
                reader.add(value, INPUTS)
        if reader.entries or has_inputs:  # rows read as rows (an OTLP file holds no rollout)
            summary.coverage[str(rows)] = reader.account(has_inputs=has_inputs, min_valid=min_valid)
    return summary.finish()
