"""NeMo Gym 0.7.0's rollout collection, live: each failure row it writes is a ``collection``
event as it is written, saved with the row under the same id.

Collection turns a failed ``/run`` into a sidecar row in ``_agent_request_failure_row``
(``nemo_gym/rollout_collection.py``; with ``+route_failures_to_sidecar=true``). That function
is wrapped once the module is imported: the row's class is the event's kind, the agent's
failure from the ``/run`` reply's report its cause, the span the ``/run`` request went out on
its place in the trace. The row gains the contract's keys (``_ng_failure_events``,
``_ng_failure_id``, ``_ng_failure_contexts``), so ``show``, ``summary`` and ``replay`` read
the very ids the live run exported, and ``replay`` into the same backend adds nothing twice.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final

from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan

from ng_otel.contract.rows import ROW_FAILURE_CLASS
from ng_otel.gym.collection import report_row
from ng_otel.gym.failures import escaped_failure
from ng_otel.otel._guard import guarded
from ng_otel.otel.recorder import get_recorder, is_enabled
from ng_otel.otel.replies import reply_of

MODULE: Final = "nemo_gym.rollout_collection"
ROW_FUNCTION: Final = "_agent_request_failure_row"
WHERE: Final = "rollout collection"


def install() -> None:
    """Wrap collection's failure rows now, or as soon as Gym's collection module loads."""
    module = sys.modules.get(MODULE)
    if module is not None:
        _wrap(module)
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(MODULE, _wrap))


@guarded
def _wrap(module: ModuleType) -> None:
    original = getattr(module, ROW_FUNCTION, None)
    if original is None or getattr(original, "_ng_otel_patched", False):
        return

    @functools.wraps(original)
    def failure_row(exc: BaseException, status: int | None) -> dict[str, Any]:
        row: dict[str, Any] = original(exc, status)
        row.update(_saved_failure(exc, status, row) or {})
        return row

    failure_row._ng_otel_patched = True  # type: ignore[attr-defined]
    setattr(module, ROW_FUNCTION, failure_row)


@guarded
def _saved_failure(exc: BaseException, status: int | None, row: dict[str, Any]) -> dict[str, Any] | None:
    if not is_enabled():
        return None
    kind = row.get(ROW_FAILURE_CLASS)
    report = escaped_failure(exc, "collection", WHERE, http_status=status, kind=kind if isinstance(kind, str) else None)
    evidence = reply_of(exc)
    # The /run request's span has ended: the event goes on a short span under it, in its trace.
    where = NonRecordingSpan(evidence.context if evidence is not None else INVALID_SPAN_CONTEXT)
    get_recorder().record(report, where, own=True)
    return report_row(report)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``action`` on one module right after it is first executed (then leaves)."""

    def __init__(self, name: str, action: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.action = action

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute, action = loader.exec_module, self.action

        def exec_module(module: ModuleType) -> None:
            execute(module)
            action(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
