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
    the report is built when the reply asks for it.

    The context variable holds the log itself, and ``close_failure_log`` empties it when the
    request closes: a context copied during the request (a keep-alive connection opened by
    it captures its context for the connection's life) then keeps one empty object, not the
    log's report and every record in it for every full garbage collection to walk."""

    # Class defaults, not __slots__ set in __init__: a healthy request's log is one object
    # that stores nothing; its first failure sets what it needs.
    observed = False
    """Whether the log holds anything a reply must carry: an attribute, as a reply reads it."""
    closed = False
    last_callee_failure: str | None = None
    """The latest failure a callee's reply reported."""
    _events: dict[str, Mapping[str, Any]] | None = None
    _failure_id: str | None = None
    _omitted = False
    _report: FailureReport | None = _EMPTY
    _token: Token[FailureLog | None] | None = None

    def add(self, report: FailureReport, *, own: bool) -> None:
        """Merge ``report``; ``own`` makes its failure the reply's own failure (and its
        records win over ones the log holds under the same id)."""
        _LOCK.acquire()  # acquire/release, not `with`: half its cost, and this runs per failure
        try:
            if self.closed:
                return  # a task that outlived its request: no reply will carry what it adds
            events = self._events
            if events is None:
                events = self._events = {}
            if own and report.failure_id is not None:
                first = not events and not self._omitted
                events.update(report.events)
                self._failure_id = report.failure_id
                if first:  # what the log holds is that report (immutable): the reply's, as it is
                    self._omitted, self._report, self.observed = report.omitted, report, True
                    return
            else:
                for event_id, record in report.events.items():
                    events.setdefault(event_id, record)
                if report.failure_id is not None:
                    self.last_callee_failure = report.failure_id
            self._omitted = self._omitted or report.omitted
            self._report = None
            self.observed = bool(events) or self._omitted
        finally:
            if self.closed:  # closed meanwhile, by a thread that found nothing yet to let go of
                self._let_go()
            _LOCK.release()

    def _let_go(self) -> None:
        self._events, self._report, self.observed, self.last_callee_failure = None, _EMPTY, False, None

    @property
    def report(self) -> FailureReport:
        """Everything added so far (both sides closed under cause_id, so the union is too)."""
        report = self._report  # one read: set or replaced whole, under the lock
        if report is not None:
            return report
        with _LOCK:
            if self._report is None:
                self._report = FailureReport._trusted(dict(self._events or {}), self._failure_id, self._omitted)
            return self._report

    def copy(self) -> FailureLog:
        """A log holding this one's report, in no context: one a closing request lets go of
        stays readable there, for a reader that answers the request after it closed."""
        copy = FailureLog()
        if self.observed:
            copy.add(self.report, own=True)
        return copy

    def __bool__(self) -> bool:
        return self.observed


_current: ContextVar[FailureLog | None] = ContextVar("ng_otel_failure_log", default=None)


def open_failure_log() -> FailureLog:
    log = FailureLog()
    log._token = _current.set(log)
    return log


def close_failure_log(log: FailureLog) -> None:
    """The request is over: its log stops collecting and lets go of what it held, wherever
    its context was copied (a task it spawned that outlives it records its failures, but no
    reply will carry them)."""
    log.closed = True  # first: an add under way sees it when it ends, and lets go itself
    if log._events is not None:  # a healthy request's log stored nothing, and takes no lock
        _LOCK.acquire()
        try:
            log._let_go()
        finally:
            _LOCK.release()
    if log._token is not None:
        _current.reset(log._token)
        log._token = None


def current_failure_log() -> FailureLog | None:
    log = _current.get()
    return None if log is None or log.closed else log
