"""Rollout collection: save each reply's failures beside its row, and replay saved rows.

    async with session.post(agent_url, json=task) as response:
        row = {**await response.json(), **report_row(reply_report(response))}

Rows keep the contract's keys (``_ng_failure_events``, ``_ng_failure_id``,
``_ng_failure_events_omitted``) plus ``_ng_failure_contexts``, the span contexts the events
were exported on, so a replayed chain has the live chain's shape and links to it. Replay and
``row_report`` also read NeMo Gym 0.7.0's rows (its ``_failures.jsonl`` sidecar and judge
rows), one event each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Link, Span, SpanContext

from ng_otel.contract.records import ROW_EVENTS, ROW_FAILURE_ID, ROW_OMITTED
from ng_otel.contract.report import FailureReport
from ng_otel.contract.rows import has_saved_report, read_row, row_report
from ng_otel.otel import names
from ng_otel.otel.links import decode_context_map, format_span_context
from ng_otel.otel.recorder import get_recorder, is_enabled
from ng_otel.runs.inputs import SkippedLine, SkippedLines

__all__ = ["ReplaySummary", "replay_row", "replay_rows", "report_row", "row_contexts", "row_report"]


def report_row(report: FailureReport | None, contexts: Mapping[str, SpanContext] | None = None) -> dict[str, Any]:
    """The row keys for ``report``; ``contexts`` defaults to where this process knows each
    event was exported. An empty report adds no key, so healthy rows stay as they were."""
    row: dict[str, Any] = {}
    if report is None:
        return row
    if report.events:
        row[ROW_EVENTS] = {event_id: dict(record) for event_id, record in report.events.items()}
    if report.failure_id is not None:
        row[ROW_FAILURE_ID] = report.failure_id
    if report.omitted:
        row[ROW_OMITTED] = True
    if contexts is None and is_enabled():
        contexts = get_recorder().index.contexts_for(report.events)
    if contexts:
        row[names.ROW_CONTEXTS] = {event_id: format_span_context(ctx) for event_id, ctx in contexts.items()}
    return row


def row_contexts(row: Mapping[str, Any]) -> dict[str, SpanContext] | None:
    """The saved span contexts of a row (``None`` when it saved none)."""
    saved = row.get(names.ROW_CONTEXTS)
    if saved is None:
        return None
    try:
        return decode_context_map(saved)
    except ValueError as error:
        raise ValueError(f"{names.ROW_CONTEXTS}: {error}") from None


@dataclass
class ReplaySummary:
    """What a replay did: memory stays flat however many rows are skipped."""

    rows: int = 0
    with_failures: int = 0
    events_recorded: int = 0
    skipped: SkippedLines = field(default_factory=SkippedLines)
    live: int = 0  # events the rows say the live run exported, not exported again
    derived: int = 0  # rows with failures but no live ids (0.7.0's keys alone): ids derived from the row

    @property
    def skipped_rows(self) -> int:
        return self.skipped.count

    def skip(self, line: int, reason: str) -> None:
        self.skipped.add(SkippedLine(line, reason))


def replay_rows(
    rows: Iterable[Mapping[str, Any]], *, first_line: int = 1, count: bool = False, include_live: bool = False
) -> ReplaySummary:
    """Turn saved rows back into telemetry through the configured providers. An event saved
    with the span context it was exported on live is in the backend that saw the run
    already: it is linked to, not exported again, unless ``include_live`` (a backend that
    did not see the run), when it is exported again on a span linked ``replay_of`` to the live
    one. A row with bad data is skipped and reported with its line number. Replayed events
    are not added to ``ng.failures`` unless ``count`` (a backend that saw the live run
    counted them then)."""
    summary = ReplaySummary()
    for line, row in enumerate(rows, start=first_line):
        replay_row(row, line, summary, count=count, include_live=include_live)
    return summary


def replay_row(
    row: Mapping[str, Any], line: int, summary: ReplaySummary, *, count: bool = False, include_live: bool = False
) -> None:
    """Replay one saved row into ``summary`` (see ``replay_rows``); never raises for bad data."""
    summary.rows += 1
    try:
        report = read_row(row)
        contexts = row_contexts(row) if report is not None else None
    except ValueError as error:
        summary.skip(line, str(error))
        return
    if report is None or not report.events:
        return
    summary.with_failures += 1
    if not has_saved_report(row):
        summary.derived += 1
    recorder = get_recorder()
    if all(event_id in recorder.index for event_id in report.events):
        return  # replayed (or recorded) here already: each event once
    # One replay span per live span the row saved, linked to it, so the replayed chain has
    # the live chain's shape: the same ids, and a cause link wherever the live run had one.
    live = {event_id: ctx for event_id, ctx in (contexts or {}).items() if ctx.is_valid and event_id in report.events}
    if not include_live and live:
        for event_id, context in live.items():
            if event_id not in recorder.index:
                summary.live += 1
            recorder.index.set(event_id, context)  # exported live: effects replayed here link to it
        if all(event_id in recorder.index for event_id in report.events):
            return
        live = {}
    spans: dict[str, Span] = {}
    by_live: dict[tuple[int, int], Span] = {}
    for event_id, context in live.items():
        key = (context.trace_id, context.span_id)
        if key not in by_live:
            link = Link(context, {names.LINK_TYPE: names.LINK_REPLAY_OF})
            by_live[key] = recorder.tracer.start_span(names.REPLAY_SPAN, links=[link])
        spans[event_id] = by_live[key]
    unplaced = any(event_id not in spans for event_id in report.events)
    opened = [*by_live.values(), *([recorder.tracer.start_span(names.REPLAY_SPAN)] if unplaced else [])]
    try:
        summary.events_recorded += recorder.record(report, opened[-1], own=True, spans=spans, count=count)
    finally:
        for span in opened:
            span.end()
