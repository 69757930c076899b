"""NeMo Gym 0.7.0's rollout collection, live: each failed rollout is a ``collection`` event
as collection learns of it, saved with its row under the same id.

Collection checks each ``/run`` reply with ``raise_for_status`` and, with
``+route_failures_to_sidecar=true``, turns a failed one into a sidecar row in
``_agent_request_failure_row`` (``nemo_gym/rollout_collection.py``); without it the run ends
there. Both are wrapped once the module is imported: a failed ``/run`` reply is a
``collection`` event when it is checked (before a run can end on it), of the class Gym gives
its row, caused by the agent's failure from the reply's report, on a short span under the one
the ``/run`` request went out on; its row saves that event (a ``/run`` that got no reply is
recorded with its row). A successful ``/run`` reply's report (a judge failure the rollout was
masked for) is saved with its row the same way, where collection reads the reply
(``get_response_json``). Rows gain the contract's keys (``_ng_failure_events``,
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

from ng_otel.contract.records import ROW_FAILURE_ID
from ng_otel.contract.report import FailureReport
from ng_otel.contract.rows import (
    ROW_FAILURE_CLASS,
    ROW_MASK_SAMPLE,
    ROW_ROLLOUT_INDEX,
    ROW_TASK_INDEX,
    row_masked,
)
from ng_otel.gym.collection import report_row
from ng_otel.gym.failures import collection_failure_kind, escaped_failure
from ng_otel.otel import names
from ng_otel.otel._guard import guarded
from ng_otel.otel.recorder import get_recorder, is_enabled
from ng_otel.otel.recovery import count_rollout
from ng_otel.otel.replies import reply_of

MODULE: Final = "nemo_gym.rollout_collection"
ROW_FUNCTION: Final = "_agent_request_failure_row"
RESULT_FUNCTION: Final = "get_response_json"  # how collection reads a /run reply's row
CHECK_FUNCTION: Final = "raise_for_status"  # how collection checks a /run reply
RUN_PATH: Final = "/run"
_RECORDED: Final = "_ng_otel_collection_report"
WHERE: Final = "rollout collection"


def install() -> None:
    """Wrap collection's failure rows and outcomes now, or as soon as Gym's collection module
    loads; its ``/run`` loops are rollouts in flight (``request_loop``)."""
    from ng_otel.gym import request_loop

    request_loop.track_runs()
    after_import(MODULE, _wrap)


def after_import(name: str, action: Callable[[ModuleType], None]) -> None:
    """Run ``action`` on the module ``name`` now, or right after it is first executed."""
    module = sys.modules.get(name)
    if module is not None:
        action(module)
    elif not any(isinstance(finder, _AfterImport) and finder.name == name for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, action))


@guarded
def _wrap(module: ModuleType) -> None:
    _wrap_outcomes(module)
    failure_row_of = getattr(module, ROW_FUNCTION, None)
    if failure_row_of is not None and not getattr(failure_row_of, "_ng_otel_patched", False):

        @functools.wraps(failure_row_of)
        def failure_row(exc: BaseException, status: int | None) -> dict[str, Any]:
            row: dict[str, Any] = failure_row_of(exc, status)
            row.update(_saved_failure(exc, status, row) or {})
            return row

        failure_row._ng_otel_patched = True  # type: ignore[attr-defined]
        setattr(module, ROW_FUNCTION, failure_row)

    check = getattr(module, CHECK_FUNCTION, None)
    if check is not None and not getattr(check, "_ng_otel_patched", False):

        @functools.wraps(check)
        async def raise_for_status(response: Any, *args: Any, **kwargs: Any) -> None:
            try:
                await check(response, *args, **kwargs)
            except Exception as error:
                _failed_run(response, error)  # the run may end here: recorded before it does
                raise

        raise_for_status._ng_otel_patched = True  # type: ignore[attr-defined]
        setattr(module, CHECK_FUNCTION, raise_for_status)

    read_json = getattr(module, RESULT_FUNCTION, None)
    if read_json is not None and not getattr(read_json, "_ng_otel_patched", False):

        @functools.wraps(read_json)
        async def result_json(response: Any) -> Any:
            result = await read_json(response)
            if isinstance(result, dict):
                result.update(_saved_report(response, result) or {})
            return result

        result_json._ng_otel_patched = True  # type: ignore[attr-defined]
        setattr(module, RESULT_FUNCTION, result_json)


@guarded
def _saved_report(response: Any, result: dict[str, Any]) -> dict[str, Any] | None:
    """The report a successful ``/run`` reply carried (a judge failure, a retried model
    attempt), as the row keys Gym Main saves: the ids the live run exported. The reply
    succeeded, so its report names no failure of its own; a masked row's is the event of the
    kind its verify response names (judge_failsafe's ``judge_failed``), as it was live."""
    from ng_otel.integrations.aiohttp import reply_report

    report = reply_report(response, boundary="collection") if is_enabled() else None
    if report is None:
        return None
    kind = result.get("failure_kind")
    if report.failure_id is None and result.get(ROW_MASK_SAMPLE) is True and isinstance(kind, str):
        named = [event_id for event_id, record in report.events.items() if record["failure_kind"] == kind]
        if len(named) == 1:
            report = FailureReport._trusted(report.events, named[0], report.omitted)
    return report_row(report)


@guarded
def _failed_run(response: Any, error: BaseException) -> None:
    """A ``/run`` reply failed: collection's event now, whether the run goes on (the row
    saves it, ``_saved_failure``) or ends here (``route_failures_to_sidecar`` off)."""
    url = str(getattr(response, "url", ""))
    status = getattr(response, "status", None)
    if is_enabled() and url.split("?", 1)[0].endswith(RUN_PATH) and isinstance(status, int):
        _record(error, status, collection_failure_kind(status))


@guarded
def _saved_failure(exc: BaseException, status: int | None, row: dict[str, Any]) -> dict[str, Any] | None:
    if not is_enabled():
        return None
    report = _recorded(exc)
    if report is None:  # no reply to check (a dropped connection, a timeout): recorded with its row
        kind = row.get(ROW_FAILURE_CLASS)
        report = _record(exc, status, kind if isinstance(kind, str) else None)
    return report_row(report)


def _record(error: BaseException, status: int | None, kind: str | None) -> FailureReport:
    report = escaped_failure(error, "collection", WHERE, http_status=status, kind=kind)
    evidence = reply_of(error)
    # The /run request's span has ended: the event goes on a short span under it, in its trace.
    where = NonRecordingSpan(evidence.context if evidence is not None else INVALID_SPAN_CONTEXT)
    get_recorder().record(report, where, own=True)
    try:
        setattr(error, _RECORDED, report)  # the row written for it saves this event, not another
    except (AttributeError, TypeError):
        pass
    return report


def _recorded(error: BaseException) -> FailureReport | None:
    report = error.__dict__.get(_RECORDED) if hasattr(error, "__dict__") else None
    return report if isinstance(report, FailureReport) else None


# -- rollout outcomes, as collection decides them ------------------------------------------------

HELPER: Final = "RolloutCollectionHelper"
DISPATCH: Final = "_run_examples_with_metadata"
NO_PERSIST: Final = "_ng_no_persist"  # rollout_collection.NG_NO_PERSIST_KEY
VERIFY_KIND: Final = "failure_kind"  # a verify response's kind, kept on a masked result


@guarded
def _wrap_outcomes(module: ModuleType) -> None:
    """Each rollout ``_run_examples_with_metadata`` dispatches is counted when its future
    resolves, by the rules ``_run_from_config`` then applies to its result: ``_ng_no_persist``
    omitted, a ``_ng_failure_class`` failed (the sidecar), ``mask_sample`` masked, else
    measured (the main rows, as the coverage account counts them)."""
    helper = getattr(module, HELPER, None)
    dispatch = getattr(helper, DISPATCH, None) if helper is not None else None
    if dispatch is None or getattr(dispatch, "_ng_otel_patched", False):
        return

    @functools.wraps(dispatch)
    def run_examples_with_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _CountedFutures(dispatch(self, *args, **kwargs), module, self)

    run_examples_with_metadata._ng_otel_patched = True  # type: ignore[attr-defined]
    setattr(helper, DISPATCH, run_examples_with_metadata)


class _CountedFutures:
    """Gym's iterator of rollout futures, each counted as it resolves; everything else
    (``aclose`` of the bounded iterator) is the iterator's own."""

    def __init__(self, futures: Any, module: ModuleType, helper: Any) -> None:
        self._futures = iter(futures)
        self._inner = futures
        self._module = module
        self._helper = helper

    def __iter__(self) -> _CountedFutures:
        return self

    def __next__(self) -> Any:
        return _counted(next(self._futures), self._module, self._helper)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def _counted(future: Any, module: ModuleType, helper: Any) -> Any:
    completed = await future
    _count_completed(module, helper, completed)
    return completed


@guarded
def _count_completed(module: ModuleType, helper: Any, completed: Any) -> None:
    if not is_enabled():
        return
    row, result = getattr(completed, "row", None), getattr(completed, "result", None)
    if not isinstance(row, dict) or not isinstance(result, dict):
        return
    outcome, kind = rollout_outcome(_as_collected(module, row, result))
    try:
        agent = str(helper._dispatch_name(row))
    except Exception:
        agent = NO_AGENT
    event_id = result.get(ROW_FAILURE_ID)
    attributes = {
        key: value
        for key, value in (
            (names.ROLLOUT_TASK_INDEX, row.get(ROW_TASK_INDEX)),
            (names.ROLLOUT_INDEX, row.get(ROW_ROLLOUT_INDEX)),
        )
        if isinstance(value, int) and not isinstance(value, bool)
    }
    count_rollout(agent, outcome, kind, event_id=event_id if isinstance(event_id, str) else None, attributes=attributes)


NO_AGENT: Final = "(no agent)"


def _as_collected(module: ModuleType, row: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The result as ``_run_from_config`` reads it: an episode response becomes its record."""
    try:
        if module._materialized_taskset(row) is not None and module._is_episode_response(result):
            record: dict[str, Any] = module._episode_record(result)
            return record
    except Exception:
        pass
    return result


def rollout_outcome(result: dict[str, Any]) -> tuple[str, str | None]:
    """(outcome, kind) of one finished rollout's result, by collection's rules."""
    failure_class = result.get(ROW_FAILURE_CLASS)
    kind = failure_class if isinstance(failure_class, str) else None
    if result.get(NO_PERSIST):
        return names.ROLLOUT_OMITTED, kind
    if failure_class is not None:
        return names.ROLLOUT_FAILED, kind
    if row_masked(result):
        verify_kind = result.get(VERIFY_KIND)
        return names.ROLLOUT_MASKED, verify_kind if isinstance(verify_kind, str) else None
    return names.ROLLOUT_MEASURED, None


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
