"""Instrumentation runs inside someone else's request, so no entry point may raise into it.

    @guarded                      # the function returns None after an internal error
    def record(...): ...

    with guard("reply headers"):  # the block is skipped from the error on
        ...

An internal error is logged, never raised: one WARNING line per place naming the exception's
type and (bounded) message, the stack at DEBUG. Under a test suite that asks for it
(``raise_internal_errors()``; the ``ng_otel`` pytest plugin does, for this project's tests
and users' alike), it is raised instead, so a bug fails a test rather than hiding in a log.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar, cast

_log = logging.getLogger("ng_otel")
_reported: set[str] = set()
_lock = threading.Lock()
_raise = False
MAX_MESSAGE_CHARS = 200  # an exception's message may quote data: a WARNING shows only its start

F = TypeVar("F", bound=Callable[..., Any])


def raise_internal_errors(value: bool = True) -> None:
    """Raise internal errors instead of logging them (for test suites)."""
    global _raise
    _raise = value


def internal_errors_raise() -> bool:
    return _raise


class guard:
    """A context manager that logs and swallows an ``Exception`` raised in its block (see
    the module docstring); ``guarded`` makes one the body of a function."""

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> guard:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> bool:
        return isinstance(error, Exception) and _swallowed(self.where, error)


def _swallowed(where: str, error: Exception) -> bool:
    """The guard's rule: an internal error is reported and swallowed, or raised under a test
    suite that asks for it."""
    if _raise:
        return False
    report_internal_error(where, error)
    return True


def swap_reported(places: Iterable[str] = ()) -> frozenset[str]:
    """The places that have reported an internal error, replaced by ``places`` (each place
    not among them warns once again): for ``ng_otel.testing``'s reset."""
    with _lock:
        before = frozenset(_reported)
        _reported.clear()
        _reported.update(places)
    return before


def report_internal_error(where: str, error: BaseException) -> None:
    """One WARNING line per place, naming the exception; the stack at DEBUG every time."""
    with _lock:
        first = where not in _reported
        _reported.add(where)
    if first:
        message = str(error)
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + "..."
        _log.warning(
            "ng_otel: internal error in %s (%s: %s); telemetry for this call was skipped",
            where,
            type(error).__name__,
            message,
        )
    _log.debug("ng_otel: internal error in %s", where, exc_info=error)


def guarded(function: F) -> F:
    """``function`` under a ``guard`` named after it: ``None`` after an internal error."""
    where = function.__qualname__

    # The guard's own rule, written out: a with-block would cost two calls on every call of
    # every guarded function (the failing path makes a dozen).
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as error:
            if not _swallowed(where, error):
                raise
            return None

    return cast(F, wrapper)
