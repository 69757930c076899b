"""The failures one request knows of, gathered for its reply's report.

Middleware opens a log per request; ``record_failure``, ``observe_failure`` and the HTTP
client hooks feed it. It lives in a context variable, so concurrent requests (tasks or
threads) never see each other's failures, while tasks spawned inside one request share it.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar, Token

from ng_otel.contract.report import FailureReport

_EMPTY = FailureReport()


class FailureLog:
    __slots__ = ("_lock", "report")

    def __init__(self) -> None:
        self.report = _EMPTY
        self._lock = threading.Lock()

    def add(self, report: FailureReport, *, own: bool) -> None:
        """Merge ``report``; ``own`` makes its failure the reply's own failure."""
        with self._lock:
            own = own and report.failure_id is not None
            self.report = report.merge(self.report) if own else self.report.merge(report)

    def __bool__(self) -> bool:
        return bool(self.report.events) or self.report.omitted


_current: ContextVar[FailureLog | None] = ContextVar("ng_otel_failure_log", default=None)


def open_failure_log() -> tuple[FailureLog, Token[FailureLog | None]]:
    log = FailureLog()
    return log, _current.set(log)


def close_failure_log(token: Token[FailureLog | None]) -> None:
    _current.reset(token)


def current_failure_log() -> FailureLog | None:
    return _current.get()
