"""The framework-free half of every HTTP adapter: what a reply carries, what a caller learns.

A server adds ``X-NG-Failure-Report`` (the request's failures) and ``X-NG-Failure-Context``
(where each was recorded) to a reply that has failures; a healthy reply carries nothing. A
caller reads both: events the callee exported are linked, never exported again; events
from a peer without ng_otel are exported here, once; a malformed header becomes one
``protocol_violation`` event at the caller's boundary and never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from ng_otel.contract.events import NgFailureEvent, bound_text
from ng_otel.contract.header import OMITTED_VALUE, REPORT_HEADER, decode_json, encode_ascii_json
from ng_otel.contract.kinds import PROTOCOL_VIOLATION
from ng_otel.contract.report import FailureReport, failure_report_for
from ng_otel.integrations.hooks import rules
from ng_otel.otel import names
from ng_otel.otel._guard import guarded
from ng_otel.otel.failure_log import FailureLog, current_failure_log
from ng_otel.otel.links import decode_context_header, encode_recorded_at
from ng_otel.otel.recorder import get_recorder, is_enabled, observe_failure, record_failure

MAX_RAW_SHOWN = 512  # how much of a malformed header a protocol_violation reason quotes


@guarded
def reply_headers(log: FailureLog) -> list[tuple[str, str]] | None:
    """The two reply headers for what ``log`` holds; none when nothing was observed (and
    ``None`` after an internal error: the reply then goes out without them)."""
    if not log.observed:
        return []
    report = log.report
    value = report.to_header()
    recorder = get_recorder()
    if value == OMITTED_VALUE and report.events:
        recorder.omitted_reports.add(1)  # the diagnostic loss happened here, at this hop
    headers = [(REPORT_HEADER, value)]
    where = recorder.index.recorded_at(report.events)
    if where:
        headers.append((names.CONTEXT_HEADER, encode_recorded_at(where)))
    return headers


def failure_reply(error: BaseException) -> tuple[int, bytes, FailureReport] | None:
    """Status, JSON body and report for an escaping exception with a Gym failure in its
    explicit chain; ``None`` for any other exception."""
    report = failure_report_for(error)
    if report is None or report.failure_id is None:
        return None
    failure = report.events[report.failure_id]
    body = encode_ascii_json({"failure": failure})
    # A failure reply is an error reply: a record may carry any status (100-599), but a 1xx
    # is no final reply, 204/304 have no body, and a 2xx or 3xx reads as success.
    status = failure.get("http_status")
    return status if status is not None and status >= 400 else 500, body.encode("ascii"), report


@guarded
def record_escaped(error: BaseException) -> None:
    """Record ``error``, which escaped a handler, as the request's own failure: its Gym
    failure, else what the registered escape rule makes of it (nothing without one)."""
    if not is_enabled():
        return
    report = failure_report_for(error)
    if report is None and rules.escape is not None:
        report = rules.escape(error)
    if report is not None:
        record_failure(report)


@guarded
def observe_reply(
    get_header: Callable[[str], str | None], boundary: str, log: FailureLog | None = None
) -> FailureReport | None:
    """Learn what a callee's reply says failed, feed the request's failure log (``log``,
    default the current one), and return the decoded report (``None`` when the reply carries
    none or it was malformed)."""
    if not is_enabled():
        return None
    raw = get_header(REPORT_HEADER)
    if raw is None:
        return None
    try:
        report = FailureReport.from_header(raw)
    except ValueError as error:
        _protocol_violation(REPORT_HEADER, raw, error, boundary)
        return None
    raw_contexts = get_header(names.CONTEXT_HEADER)
    recorder = get_recorder()
    if raw_contexts is None:
        recorder.record(report, own=False)  # a peer without ng_otel: its events are ours to export
    else:
        try:
            contexts = decode_context_header(raw_contexts)
        except ValueError as error:
            _protocol_violation(names.CONTEXT_HEADER, raw_contexts, error, boundary)
            contexts = None  # the peer did export them; we only lose the links
        if not recorder.learn_remote(report, contexts):
            recorder.record(report, own=False)  # the events the callee's map does not name are ours to export
    log = log if log is not None else current_failure_log()
    if log is not None:
        log.add(report, own=False)
    return report


FAILURE_HEADERS: Final = frozenset({REPORT_HEADER.lower(), names.CONTEXT_HEADER.lower()})


def adopt_app_headers(get_header: Callable[[str], str | None], log: FailureLog, boundary: str, status: int) -> None:
    """A report the app put on its own reply (a proxy forwarding its callee's) joins the
    request's log, as a callee's would, so the reply carries one ``X-NG-Failure-Report`` with
    every event instead of the app's, stale, beside ng_otel's. A failed reply passed through
    that way fails with the callee's failure, unless this request has one of its own."""
    if get_header(REPORT_HEADER) is None:
        return
    report = observe_reply(get_header, boundary, log)
    if report is not None and report.failure_id is not None and status >= 400 and log.report.failure_id is None:
        log.add(report, own=True)


def _protocol_violation(header: str, raw: Any, error: ValueError, boundary: str) -> None:
    shown = raw if isinstance(raw, str) else repr(raw)
    reason = f"malformed {header} from peer: {error}; raw value: {bound_text(json.dumps(shown), MAX_RAW_SHOWN)}"
    observe_failure(NgFailureEvent(PROTOCOL_VIOLATION, reason, boundary=boundary))


@guarded
def read_reply(body: bytes) -> None:
    """Give the registered reply reader ``body`` decoded (the ASGI and aiohttp servers alike)."""
    reader = rules.reply_reader
    if reader is None:
        return
    try:
        value = decode_json(body, "reply to read")
    except ValueError:
        value = None  # not JSON after all (or nested past any reply worth reading)
    reader(value)
