"""The failures one request knows of, gathered for its reply's report.

Middleware opens a log per request; ``record_failure``, ``observe_failure`` and the HTTP
client hooks feed it. It lives in a context variable, so concurrent requests (tasks or
threads) never see each other's failures, while tasks spawned inside one request share it
until the request closes.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextvars import ContextVar, Token
from typing import Any

from ng_otel.contract.report import FailureReport

_EMPTY = FailureReport()
_LOCK = threading.Lock()
"""One lock for every request's log: a log is touched by one task at a time unless the request
spawned threads, each critical section is a few dict operations, and a request that observes
nothing then allocates no lock."""


class FailureLog:
    """Grows in place: a request that observes thousands of failures pays for each once, and
    the report is built when the reply asks for it."""

    __slots__ = ("_events", "_failure_id", "_omitted", "_report", "last_callee_failure")

    def __init__(self) -> None:
        self._events: dict[str, Mapping[str, Any]] = {}
        self._failure_id: str | None = None
        self.last_callee_failure: str | None = None  # the latest failure a callee's reply reported
        self._omitted = False
        self._report: FailureReport | None = _EMPTY

    def add(self, report: FailureReport, *, own: bool) -> None:
        """Merge ``report``; ``own`` makes its failure the reply's own failure (and its
        records win over ones the log holds under the same id)."""
        _LOCK.acquire()  # acquire/release, not `with`: half its cost, and this runs per failure
        try:
            if own and report.failure_id is not None:
                first = not self._events and not self._omitted
                self._events.update(report.events)
                self._failure_id = report.failure_id
                if first:  # what the log holds is that report (immutable): the reply's, as it is
                    self._omitted, self._report = report.omitted, report
                    return
            else:
                for event_id, record in report.events.items():
                    self._events.setdefault(event_id, record)
                if report.failure_id is not None:
                    self.last_callee_failure = report.failure_id
            self._omitted = self._omitted or report.omitted
            self._report = None
        finally:
            _LOCK.release()

    @property
    def report(self) -> FailureReport:
        """Everything added so far (both sides closed under cause_id, so the union is too)."""
        report = self._report  # one read: set or replaced whole, under the lock
        if report is not None:
            return report
        with _LOCK:
            if self._report is None:
                self._report = FailureReport._trusted(dict(self._events), self._failure_id, self._omitted)
            return self._report

    def __bool__(self) -> bool:
        return bool(self._events) or self._omitted


class LogSlot:
    """What the context variable holds: the request's log until it closes, and what
    ``close_failure_log`` takes. A context copied during the request keeps the slot, not the
    log: a keep-alive connection opened by the request captures its context for the
    connection's life, and would otherwise keep the log, its report and every record in it
    for every full garbage collection to walk."""

    __slots__ = ("log", "token")

    def __init__(self, log: FailureLog) -> None:
        self.log: FailureLog | None = log
        self.token: Token[LogSlot | None] | None = None


_current: ContextVar[LogSlot | None] = ContextVar("ng_otel_failure_log", default=None)


def open_failure_log() -> tuple[FailureLog, LogSlot]:
    log = FailureLog()
    slot = LogSlot(log)
    slot.token = _current.set(slot)
    return log, slot


def close_failure_log(slot: LogSlot) -> None:
    """The request is over: its log stops collecting, wherever its context was copied (a task
    it spawned that outlives it records its failures, but no reply will carry them)."""
    slot.log = None
    if slot.token is not None:
        _current.reset(slot.token)


def current_failure_log() -> FailureLog | None:
    slot = _current.get()
    return None if slot is None else slot.log
