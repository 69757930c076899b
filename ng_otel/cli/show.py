"""``ng-otel show``: failure chains (``ng_otel.runs.chains``) drawn as trees."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.text import Text

from ng_otel.cli._text import MAX_SHOWN_PATH, clean
from ng_otel.runs.chains import FailureGroup, groups_from_lines
from ng_otel.runs.inputs import MAX_LISTED_SKIPPED, SkippedLine, file_lines

SHORT_ID: Final = 12
MAX_NESTED_DEPTH: Final = 32  # levels a chain nests; its deeper causes are drawn flat, so output is linear


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
    bad: list[SkippedLine] = field(default_factory=list)  # the first MAX_LISTED_SKIPPED
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
                if len(result.bad) < MAX_LISTED_SKIPPED:
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
        lines = file_lines(path)  # no progress bar: the trees are the progress
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


def show_command(args: Any, console: Console) -> int:
    return show_paths(
        args.file, console, kind=args.kind, boundary=args.boundary, limit=args.limit, full_ids=args.full_ids
    )
