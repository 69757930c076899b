"""Instrumentation runs inside someone else's request, so no entry point may raise into it."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

_log = logging.getLogger("ng_otel")
_reported: set[str] = set()
_lock = threading.Lock()

F = TypeVar("F", bound=Callable[..., Any])


def log_internal_error(where: str) -> None:
    """Call from an ``except`` block: one WARNING line per place, the stack at DEBUG."""
    with _lock:
        first = where not in _reported
        _reported.add(where)
    if first:
        _log.warning("ng_otel: internal error in %s; telemetry for this call was skipped", where)
    _log.debug("ng_otel: internal error in %s", where, exc_info=True)


def guarded(function: F) -> F:
    """Catch and log every ``Exception`` of ``function`` and return ``None`` instead."""
    where = function.__qualname__

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception:
            log_internal_error(where)
            return None

    return cast(F, wrapper)
