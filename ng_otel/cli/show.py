"""Failure chains read from saved rollout rows or OTLP JSON lines, drawn as trees.

Rows stream: one tree per row, memory flat on any file. OTLP JSON lines are grouped by trace
(a trace's spans come in many lines), and traces joined by a cause link are one tree.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from ng_otel.contract.events import BOUNDARIES, EVENT_ID_RE
from ng_otel.contract.kinds import is_well_formed
from ng_otel.contract.report import FailureReport
from ng_otel.contract.rows import (
    ROW_ROLLOUT_INDEX,
    ROW_TASK_INDEX,
    SkippedLine,
    read_json_lines,
    read_row,
    row_terminal,
)
from ng_otel.otel import names

MAX_SHOWN_REASON: Final = 160  # a tree line is for a glance; the full reason is in the trace
SHORT_ID: Final = 12
MAX_NESTED_DEPTH: Final = 32  # levels a chain nests; its deeper causes are drawn flat, so output is linear
MAX_SHOWN_PATH: Final = 4096  # PATH_MAX: a file's name is printed whole
MAX_LISTED_BAD: Final = 50  # skipped lines listed at the end; the rest are counted
PROGRESS_AFTER: Final = 1.0  # seconds: a read shorter than this shows no progress bar


@dataclass
class FailureGroup:
    """The failures of one rollout row or one trace (or traces a cause link joins)."""

    title: str
    events: dict[str, dict[str, Any]]
    failure_id: str | None = None
    omitted: bool = False
    recovered: set[str] = field(default_factory=set)
    services: dict[str, str] = field(default_factory=dict)

    def matches(self, kind: str | None, boundary: str | None) -> bool:
        return any(
            (kind is None or record["failure_kind"] == kind) and (boundary is None or record["boundary"] == boundary)
            for record in self.events.values()
        )

    def roots(self) -> list[str]:
        """Effects that nothing here names as its cause, the reply's own failure first."""
        causes = {record.get("cause_id") for record in self.events.values()}
        tops = [event_id for event_id in self.events if event_id not in causes]
        return sorted(tops, key=lambda event_id: (event_id != self.failure_id, event_id in self.recovered))


# -- reading ---------------------------------------------------------------------------------


def scan_file(path: Path, console: Console | None = None, description: str = "reading") -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON value or ``SkippedLine``) for each non-blank line of ``path``,
    lines bounded (``read_json_lines``); with a ``console`` on a terminal, a progress bar once
    the read has taken a second. Without one, no bar: ``show`` prints trees as it reads, and a
    live bar would redraw itself at each of them."""
    with open_rows(path) as stream:
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        progress = _LazyProgress(console, f"{description} {clean(path.name, MAX_SHOWN_PATH)}", size or None, stream)
        try:
            # The bar moves as chunks are read, so a line costs nothing more than its reading.
            yield from read_json_lines(progress if progress.shown_on_terminal else stream)
        finally:
            progress.close()


def open_rows(path: Path) -> IO[bytes]:
    """``path`` opened to read rows or OTLP JSON lines. A device (``/dev/zero``,
    ``/dev/urandom``) is refused with an ``OSError`` naming it: it never ends, and holds no
    line to read; a pipe or a regular file is read."""
    stream = path.open("rb")
    try:
        mode = os.fstat(stream.fileno()).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise OSError(errno.ENODEV, "a device, not a file of rows", str(path))
    except BaseException:
        stream.close()
        raise
    return stream


class _LazyProgress:
    """A transient progress bar that appears only on a terminal and only after a second: a
    binary stream whose every read moves it."""

    def __init__(self, console: Console | None, description: str, total: int | None, stream: IO[bytes]) -> None:
        self._console = console if console is not None and console.is_terminal else None
        self._description, self._total = description, total
        self._stream = stream
        self._show_at = time.monotonic() + PROGRESS_AFTER
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    @property
    def shown_on_terminal(self) -> bool:
        return self._console is not None

    def read(self, size: int = -1) -> bytes:
        chunk = self._stream.read(size)
        self._tick()
        return chunk

    def _tick(self) -> None:
        if self._console is None:
            return
        if self._progress is None:
            if time.monotonic() < self._show_at:
                return
            self._progress = Progress(
                TextColumn("{task.description}", markup=False),  # it holds a file's name
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(),
                console=self._console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self._description, total=self._total)
        try:
            position = self._stream.tell()
        except OSError:  # a pipe
            return
        assert self._task is not None
        self._progress.update(self._task, completed=position)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


NO_TRACE_IDS: Final = frozenset({"", "?", "0" * 32})
"""OTLP JSON's ways of saying "no trace" (a log record outside any span): each such event is a
row, and a tree, of its own."""
UNDECIDED_NOT_AN_OBJECT: Final = "not a JSON object: a row and an OTLP JSON line are objects"
"""Why a line before a file's first JSON object (which decides rows or OTLP) is skipped."""
INVALID_OTLP_EVENT: Final = "an ng.failure event without a valid id, kind or boundary"
OTLP_LINE_AMONG_ROWS: Final = "an OTLP JSON line in a file of rows (its first JSON object decides)"
ROW_AMONG_OTLP_LINES: Final = "not an OTLP JSON line in a file of OTLP JSON lines (its first JSON object decides)"


def is_otlp(value: Any) -> bool:
    """An OTLP JSON line: an object with ``resourceSpans``, ``resourceMetrics`` or ``resourceLogs``."""
    return isinstance(value, dict) and (
        "resourceSpans" in value or "resourceMetrics" in value or "resourceLogs" in value
    )


class FileFormat:
    """Rows or OTLP JSON lines, as a file's first JSON object says; one per file read."""

    def __init__(self) -> None:
        self.otlp: bool | None = None  # undecided until the first JSON object

    def misfit(self, value: Any) -> str | None:
        """Why a decoded line is skipped for its format (before the first object: not being
        one; after it: being of the other format), or ``None`` when it belongs."""
        if self.otlp is None:
            if not isinstance(value, dict):
                return UNDECIDED_NOT_AN_OBJECT
            self.otlp = is_otlp(value)
        elif is_otlp(value) != self.otlp:
            return ROW_AMONG_OTLP_LINES if self.otlp else OTLP_LINE_AMONG_ROWS
        return None


def groups_from_lines(lines: Iterable[tuple[int, Any]]) -> Iterator[FailureGroup | SkippedLine]:
    """Rows or OTLP JSON lines, as the first JSON object says (the lines before it decide
    nothing, as in ``ng-otel summary``); a line of the other format is a skipped line."""
    lines = iter(lines)
    for number, value in lines:
        if isinstance(value, SkippedLine):
            yield value
            continue
        if not isinstance(value, dict):
            yield SkippedLine(number, UNDECIDED_NOT_AN_OBJECT)
            continue
        rest = itertools.chain([(number, value)], lines)
        yield from groups_from_otlp(rest) if is_otlp(value) else groups_from_rows(rest)
        return


# -- rows ------------------------------------------------------------------------------------


def groups_from_rows(lines: Iterable[tuple[int, Any]]) -> Iterator[FailureGroup | SkippedLine]:
    for number, row in lines:
        if isinstance(row, SkippedLine):
            yield row
            continue
        if is_otlp(row):
            yield SkippedLine(number, OTLP_LINE_AMONG_ROWS)
            continue
        try:
            report = read_row(row)
        except ValueError as error:
            yield SkippedLine(number, str(error))
            continue
        if report is None or (not report.events and not report.omitted):
            continue
        yield _group_of(_row_title(number, row), report)


def _row_title(number: int, row: Mapping[str, Any]) -> str:
    parts = [f"line {number}"]
    for key, label in _TITLE_KEYS:
        value = row.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            parts.append(f"{label} {value}")
    if row_terminal(row):
        parts.append("terminal")
    return " · ".join(parts)


_TITLE_KEYS = (
    ("scenario", "scenario"),
    ("task_id", "task_id"),
    (ROW_TASK_INDEX, "task"),
    (ROW_ROLLOUT_INDEX, "rollout"),
    ("episode_id", "episode_id"),
    ("status", "status"),
    ("trace_id", "trace_id"),
)


def _group_of(title: str, report: FailureReport) -> FailureGroup:
    return FailureGroup(
        title=title,
        events=report.events,  # type: ignore[arg-type]  # read only here
        failure_id=report.failure_id,
        omitted=report.omitted,
        recovered=set(report.recovered_ids()) if len(report.events) > 1 or report.failure_id is None else set(),
    )


# -- OTLP JSON lines -------------------------------------------------------------------------


OtlpFailure = tuple[str, dict[str, Any], int]  # trace id, the event's attributes, unix nanoseconds or 0


def otlp_line_failures(
    number: int, data: Mapping[str, Any], traces: set[str]
) -> tuple[list[OtlpFailure], SkippedLine | None]:
    """The ``ng.failure`` events of one OTLP JSON line that a row could hold too, and the line
    as one ``SkippedLine`` when any event could not be read (once, however many)."""
    failures: list[OtlpFailure] = []
    invalid = False
    for trace_id, attributes, unix_nanos in otlp_failure_events(data, traces):
        if attributes is None:
            invalid = True
        else:
            failures.append((trace_id, attributes, unix_nanos))
    return failures, SkippedLine(number, INVALID_OTLP_EVENT) if invalid else None


def otlp_failure_events(data: Mapping[str, Any], traces: set[str]) -> Iterator[tuple[str, dict[str, Any] | None, int]]:
    """(trace id, the event's attributes or ``None`` when it lacks its id, kind or boundary,
    time in unix nanoseconds or 0) for each ``ng.failure`` span event and log record of one
    OTLP JSON line; each span's trace id is added to ``traces``. Tolerant of any shape."""
    for resource_spans in _list(data.get("resourceSpans")):
        service = _attributes(_dict(_dict(resource_spans).get("resource")).get("attributes")).get("service.name", "?")
        for scope_spans in _list(_dict(resource_spans).get("scopeSpans")):
            for span in _list(_dict(scope_spans).get("spans")):
                span = _dict(span)
                trace_id = _trace_id(span)
                traces.add(trace_id)
                for event in _list(span.get("events")):
                    event = _dict(event)
                    if event.get("name") == names.EVENT:
                        yield trace_id, _failure_attributes(event.get("attributes"), service), _time(event)
    for resource_logs in _list(data.get("resourceLogs")):
        service = _attributes(_dict(_dict(resource_logs).get("resource")).get("attributes")).get("service.name", "?")
        for scope_logs in _list(_dict(resource_logs).get("scopeLogs")):
            for log in _list(_dict(scope_logs).get("logRecords")):
                log = _dict(log)
                if log.get("eventName") == names.EVENT:
                    yield _trace_id(log), _failure_attributes(log.get("attributes"), service), _time(log)


def _failure_attributes(items: Any, service: Any) -> dict[str, Any] | None:
    """The event's attributes, or ``None`` when its id, kind or boundary is not one a row could
    hold either (so an OTLP line and a row are held to the same names)."""
    attributes = _attributes(items)
    event_id, kind, boundary = (attributes.get(key) for key in (names.ID, names.KIND, names.BOUNDARY))
    if not (
        isinstance(event_id, str)
        and EVENT_ID_RE.fullmatch(event_id)
        and is_well_formed(kind)
        and boundary in BOUNDARIES
    ):
        return None
    attributes["service.name"] = service
    return attributes


def _time(item: Mapping[str, Any]) -> int:
    try:
        return int(item.get("timeUnixNano", 0))
    except (TypeError, ValueError, OverflowError):  # not a number, NaN, Infinity: no time
        return 0


def _trace_id(item: Mapping[str, Any]) -> str:
    """The item's trace id; "" (no trace) for one that is missing or not a string."""
    trace_id = item.get("traceId")
    return trace_id if isinstance(trace_id, str) else ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _attributes(items: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in _list(items):
        value = _dict(_dict(item).get("value"))
        for kind in ("stringValue", "boolValue", "intValue", "doubleValue"):
            if kind in value:
                raw = value[kind]
                if kind == "intValue":
                    try:
                        raw = int(raw) if isinstance(raw, (int, str)) and len(str(raw)) < 20 else None
                    except ValueError:
                        raw = None
                if raw is not None:
                    values[str(_dict(item).get("key", ""))] = raw
    return values


def groups_from_otlp(lines: Iterable[tuple[int, Any]]) -> Iterator[FailureGroup | SkippedLine]:
    """One group per trace, from the ``ng.failure`` events of OTLP JSON lines; traces that a
    cause link joins (a cause recorded in another trace) are one group, so one tree."""
    traces: dict[str, FailureGroup] = {}
    where: dict[str, str] = {}  # event id -> trace id
    seen: set[str] = set()
    for number, data in lines:
        if isinstance(data, SkippedLine):
            yield data
            continue
        if not is_otlp(data):
            yield SkippedLine(number, ROW_AMONG_OTLP_LINES)
            continue
        failures, skipped = otlp_line_failures(number, data, seen)
        if skipped is not None:
            yield skipped
        for trace_id, attributes, _ in failures:
            record = _record_of(attributes)
            event_id = record["event_id"]
            if trace_id in NO_TRACE_IDS:
                trace_id = f"(none: event {event_id})"  # a key no hex trace id can be
            group = traces.setdefault(trace_id, FailureGroup(title=f"trace {trace_id}", events={}))
            group.events[event_id] = record
            where.setdefault(event_id, trace_id)
            group.services[event_id] = str(attributes["service.name"])
            if record.pop("recovered", False):
                group.recovered.add(event_id)
    yield from _joined(traces, where)


def _joined(traces: dict[str, FailureGroup], where: Mapping[str, str]) -> Iterator[FailureGroup]:
    parent = {trace_id: trace_id for trace_id in traces}

    def find(trace_id: str) -> str:
        while parent[trace_id] != trace_id:
            parent[trace_id] = parent[parent[trace_id]]
            trace_id = parent[trace_id]
        return trace_id

    for trace_id, group in traces.items():
        for record in group.events.values():
            cause_trace = where.get(record.get("cause_id") or "")
            if cause_trace is not None and cause_trace != trace_id:
                parent[find(trace_id)] = find(cause_trace)
    members: dict[str, list[str]] = {}
    for trace_id in traces:
        members.setdefault(find(trace_id), []).append(trace_id)
    for trace_ids in members.values():
        if len(trace_ids) == 1:
            group = traces[trace_ids[0]]
        else:
            group = FailureGroup(title="traces " + " + ".join(trace_ids), events={})
            for trace_id in trace_ids:
                group.events.update(traces[trace_id].events)
                group.services.update(traces[trace_id].services)
                group.recovered |= traces[trace_id].recovered
        if group.events:
            yield group


def _record_of(attributes: Mapping[str, Any]) -> dict[str, Any]:
    record = {
        "event_id": str(attributes[names.ID]),
        "boundary": str(attributes[names.BOUNDARY]),
        "failure_kind": str(attributes[names.KIND]),
        "failure_reason": str(attributes.get(names.REASON, "")),
        "recovered": attributes.get(names.RECOVERED) is True,
    }
    for key, name in (("stage", names.STAGE), ("http_status", names.HTTP_STATUS)):
        if name in attributes:
            record[key] = attributes[name]
    # A cause id is a dict key and a set member from here on: one that is not a string is no cause.
    if isinstance(attributes.get(names.CAUSE_ID), str):
        record["cause_id"] = attributes[names.CAUSE_ID]
    if isinstance(attributes.get(names.FOREIGN_TYPE), str):
        record["foreign_error"] = {"type": attributes[names.FOREIGN_TYPE]}
    return record


# -- drawing ---------------------------------------------------------------------------------


def printable(text: str, limit: int = MAX_SHOWN_REASON) -> str:
    """Safe for a terminal and for rich markup: no control characters (no escape sequences),
    markup escaped."""
    return escape(clean(text, limit))


def clean(text: str, limit: int = MAX_SHOWN_REASON) -> str:
    """Safe for a terminal: no control characters, at most ``limit`` characters."""
    text = text[: limit + 1]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else "\N{REPLACEMENT CHARACTER}" for c in text)
    if len(text) > limit:
        text = text[: limit - 1] + "\N{HORIZONTAL ELLIPSIS}"
    return text


Line = list[tuple[str, str]]  # (text, rich style) segments


def tree_lines(group: FailureGroup, *, full_ids: bool = False) -> list[Line]:
    """The group's tree, line by line: its title, then each chain from its top effect down to
    its root cause, each child the cause of the node above.

    A chain nests ``MAX_NESTED_DEPTH`` levels at most: there one line says the causes below are
    drawn flat, at that depth, each still the cause of the one above, so a chain of 10,000
    events (a report's bound) prints in lines of bounded width, not 4 more characters a level.
    Every event is drawn once: a cause already drawn (a loop of causes, or a cause two effects
    share) is one line, ``↻ cause <id> already shown above``, and a loop that no top leads into
    is drawn from its first event."""
    title: Line = [(clean(group.title, 200 if not full_ids else 2000), "cyan")]
    if group.omitted:
        title.append(("  report omitted", "red"))
    lines = [title]
    chains = _chains(group)
    for number, (chain, shown_cause) in enumerate(chains, start=1):
        prefix = ""
        for depth, record in enumerate(chain):
            last = depth > 0 or number == len(chains)
            if depth == MAX_NESTED_DEPTH:
                flat = f"┆ the {len(chain) - depth} cause(s) below are drawn flat, each the cause of the one above"
                lines.append([(prefix, "tree.line"), (flat, "dim")])
            lines.extend(_node_lines(group, record, prefix + ("└── " if last else "├── "), full_ids))
            lines[-1][0] = (prefix + ("    " if last else "│   "), "tree.line")
            if depth < MAX_NESTED_DEPTH:
                prefix += "    " if last else "│   "
        if shown_cause is not None:
            shown_id = clean(shown_cause if full_ids else shown_cause[:SHORT_ID], 128)
            lines.append([(prefix + "└── ", "tree.line"), (f"↻ cause {shown_id} already shown above", "dim")])
    if group.omitted and not group.events:
        lines.append(
            [("└── ", "tree.line"), ("the reply's report exceeded 4096 bytes; its events are in the traces", "dim")]
        )
    return lines


def _chains(group: FailureGroup) -> list[tuple[list[Mapping[str, Any]], str | None]]:
    """Each chain to draw, with the id of the cause it ends at when that cause is drawn already:
    from each top effect first, then from the first event not yet drawn (a loop's)."""
    chains: list[tuple[list[Mapping[str, Any]], str | None]] = []
    shown: set[str] = set()
    for start in itertools.chain(group.roots(), group.events):
        if start in shown:
            continue
        chain: list[Mapping[str, Any]] = []
        current: str | None = start
        while current is not None and current in group.events and current not in shown:
            shown.add(current)
            chain.append(group.events[current])
            current = group.events[current].get("cause_id")
        chains.append((chain, current if current in shown else None))
    return chains


def _node_lines(group: FailureGroup, record: Mapping[str, Any], guide: str, full_ids: bool) -> list[Line]:
    event_id = str(record["event_id"])
    details = [str(record["boundary"])]
    if record.get("stage"):
        details.append(f"stage {record['stage']}")
    if record.get("http_status"):
        details.append(str(record["http_status"]))
    if event_id in group.services:
        details.append(group.services[event_id])
    head: Line = [(guide, "tree.line"), (clean(str(record["failure_kind"]), 80), "bold")]
    if event_id in group.recovered:
        head.append((" (recovered)", "yellow"))
    head += [
        ("  " + clean(" · ".join(details), 120), ""),
        ("  " + clean(event_id if full_ids else event_id[:SHORT_ID], 128), "dim"),
    ]
    body: Line = [("", ""), (clean(str(record["failure_reason"])), "")]
    foreign = record.get("foreign_error")
    if isinstance(foreign, Mapping) and isinstance(foreign.get("type"), str):
        body.append(("  via " + clean(foreign["type"], 60), "dim"))
    return [head, body]


def render(group: FailureGroup, *, full_ids: bool = False) -> Text:
    """The group's tree as rich ``Text`` (styles, never markup: nothing from a row is parsed)."""
    text = Text()
    for line in tree_lines(group, full_ids=full_ids):
        for segment, style in line:
            text.append(segment, style or None)
        text.append("\n")
    text.rstrip()
    return text


class TreeWriter:
    """Prints trees line by line, straight to the console's file in batches: plain text on a
    pipe; on a terminal, each segment between the escape codes rich prints for its style (asked
    of rich once a style: printing each tree through rich took 9x as long as the pipe). What
    makes ``show`` of a whole run take seconds, not minutes."""

    def __init__(self, console: Console, *, full_ids: bool = False) -> None:
        self.console, self.full_ids = console, full_ids
        self._styled = console.is_terminal
        self._codes: dict[str, tuple[str, str]] = {}  # style -> the escape codes before and after a text
        self._buffer: list[str] = []

    def write(self, group: FailureGroup) -> None:
        for line in tree_lines(group, full_ids=self.full_ids):
            if self._styled:
                self._buffer.append("".join(self._in_style(text, style) for text, style in _rstripped(line)))
            else:
                self._buffer.append("".join(text for text, _ in line).rstrip())
        if len(self._buffer) > 4096:
            self.flush()

    def _in_style(self, text: str, style: str) -> str:
        if not text or not style:
            return text
        codes = self._codes.get(style)
        if codes is None:
            # The console's own rendering: its colour system, NO_COLOR and theme decide.
            with self.console.capture() as captured:
                self.console.print(Text(_STYLED, style), end="", soft_wrap=True)
            before, _, after = captured.get().partition(_STYLED)
            codes = self._codes[style] = (before, after)
        return codes[0] + text + codes[1]

    def flush(self) -> None:
        if self._buffer:
            self._buffer.append("")
            self.console.file.write("\n".join(self._buffer))
            self._buffer.clear()
        self.console.file.flush()


def _rstripped(line: Line) -> Line:
    """The line without its trailing whitespace, as a pipe gets it."""
    segments = list(line)
    while segments and not segments[-1][0].rstrip():
        segments.pop()
    if segments:
        segments[-1] = (segments[-1][0].rstrip(), segments[-1][1])
    return segments


_STYLED: Final = "\ue000"  # a private-use character: the text whose escape codes are asked for


@dataclass
class ShowResult:
    shown: int = 0
    more: bool = False  # stopped at --limit with more left unread
    bad: list[SkippedLine] = field(default_factory=list)  # the first MAX_LISTED_BAD
    bad_count: int = 0


def show_groups(
    groups: Iterable[FailureGroup | SkippedLine],
    console: Console,
    *,
    kind: str | None = None,
    boundary: str | None = None,
    limit: int | None = None,
    full_ids: bool = False,
) -> ShowResult:
    result = ShowResult()
    writer = TreeWriter(console, full_ids=full_ids)
    try:
        for group in groups:
            if isinstance(group, SkippedLine):
                result.bad_count += 1
                if len(result.bad) < MAX_LISTED_BAD:
                    result.bad.append(group)
                continue
            if (kind is None and boundary is None) or group.matches(kind, boundary):
                if limit is not None and result.shown >= limit:
                    result.more = True
                    break
                writer.write(group)
                result.shown += 1
    finally:
        writer.flush()
    return result


def show_paths(
    paths: Iterable[Path],
    console: Console,
    *,
    kind: str | None = None,
    boundary: str | None = None,
    limit: int | None = None,
    full_ids: bool = False,
) -> int:
    """``ng-otel show``: each file's chains, then a closing line and its skipped lines."""
    for path in paths:
        name = clean(str(path), MAX_SHOWN_PATH)  # printed as text (never markup), control characters replaced
        lines = scan_file(path)  # no progress bar: the trees are the progress
        first = next(lines, None)
        if first is None:
            console.print(Text(f"{name}: no rows", "dim"))
            continue
        groups = groups_from_lines(itertools.chain([first], lines))
        result = show_groups(groups, console, kind=kind, boundary=boundary, limit=limit, full_ids=full_ids)
        more = f" (the first {limit}: --limit)" if result.more else ""
        console.print(Text(f"{result.shown} failure chain group(s) shown from {name}{more}"))
        for item in result.bad:
            console.print(Text(f"line {item.line}: skipped: {clean(item.reason, 200)}", "red"))
        if result.bad_count > len(result.bad):
            console.print(Text(f"... and {result.bad_count - len(result.bad)} more skipped line(s)", "red"))
    return 0


__all__ = [
    "INVALID_OTLP_EVENT",
    "UNDECIDED_NOT_AN_OBJECT",
    "NO_TRACE_IDS",
    "OTLP_LINE_AMONG_ROWS",
    "ROW_AMONG_OTLP_LINES",
    "FailureGroup",
    "FileFormat",
    "clean",
    "groups_from_lines",
    "groups_from_otlp",
    "groups_from_rows",
    "is_otlp",
    "printable",
    "render",
    "open_rows",
    "scan_file",
    "show_paths",
    "tree_lines",
]
