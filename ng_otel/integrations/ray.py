"""Ray: the caller's W3C trace context into actor methods and tasks, Gym failures back intact.

NeMo Gym scales out on Ray, and NeMo-RL drives Gym from a Ray actor. Ray carries no
OpenTelemetry context across a call, and an exception crossing back keeps only what pickles.

- **Calls**: each actor method call, actor creation and task carries the caller's context as
  the ``_ray_trace_ctx`` keyword, the one Ray's own tracing hook uses
  (``ray/util/tracing/tracing_helper.py``), and the callee makes it current while the call
  runs. A call that already carries the keyword (Ray's tracing is on, or NeMo-RL's or
  nemo-lens's carrier put it there) gets nothing added; where Ray's tracing is on in the
  callee, Ray makes it current and this adapter does not.
- **Failures**: a Gym failure escaping an actor method or task is recorded there (events the
  process knows already add nothing: the Gym servers it called exported theirs) and crosses
  with the span context where each event of its chain was recorded
  (``NgFailureEvent.recorded_at``, in the ``X-NG-Failure-Context`` encoding), flushed first
  when this process recorded any of them. The caller learns those spans from the
  ``RayTaskError`` that ``ray.get`` raises, whose explicit cause becomes the failure, so a
  failure the caller raises ``from`` it links to them and exports nothing twice.
- **Exits**: ``ray.actor.exit_actor`` (which ``__ray_terminate__`` calls) flushes first.

Switch it on with ``instrument()`` in the driver and in every worker (Ray's
``worker_process_setup_hook``: ``setup_worker``), or with ``opentelemetry-instrument``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import inspect
import sys
from collections.abc import Callable
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from ng_otel.contract.classify import DEFAULT_CLASSIFIER, FailureClass
from ng_otel.contract.events import NgFailureEvent, gym_event_view
from ng_otel.contract.report import failure_report_for, find_boundary_failure
from ng_otel.integrations import Patch
from ng_otel.otel._guard import guard, guarded
from ng_otel.otel.links import decode_context_map
from ng_otel.otel.recorder import get_recorder, is_enabled

KEYWORD: Final = "_ray_trace_ctx"  # Ray's tracing hook's keyword: every actor method declares it
FLUSH_BEFORE_CROSSING_MILLIS: Final = 2_000  # a failing call waits at most this for its events' export
FLUSH_BEFORE_EXIT_MILLIS: Final = 5_000  # a graceful actor exit waits at most this for everything held
RAY_PACKAGE: Final = "ray"
DEFAULT_WORKER_SERVICE: Final = "ray-worker"  # a worker's service name where the environment names none

_PATCHED: list[tuple[Any, str, Any]] = []  # (owner, name, original) of what instrument() patched


# -- switching it on -------------------------------------------------------------------------


def patch_framework(patch: Patch) -> None:
    """Patch Ray's seams through ``patch(owner, name, make)``, which replaces
    ``owner.name`` with ``make(original)`` reversibly (the instrumentor undoes it). Where Ray
    is installed but not imported yet, this waits for its import: importing Ray costs a
    process about 0.8 s, which a process that never uses Ray (a Gym server) should not pay."""
    if RAY_PACKAGE in sys.modules:
        _patch_ray(patch)
    elif importlib.util.find_spec(RAY_PACKAGE) is not None:
        sys.meta_path.insert(0, _PatchWhenImported(patch))


def _patch_ray(patch: Patch) -> None:
    import ray.actor  # type: ignore[import-not-found, unused-ignore]
    import ray.exceptions  # type: ignore[import-not-found, unused-ignore]
    import ray.remote_function  # type: ignore[import-not-found, unused-ignore]
    from ray._common import signature  # type: ignore[import-not-found, unused-ignore]
    from ray._private import function_manager  # type: ignore[import-not-found, unused-ignore]

    # Below Ray's tracing layer in ``_remote``, which asserts the keyword is absent while its
    # tracing is off: where Ray checks a call's arguments against the callee's signature.
    patch(signature, "flatten_args", _carrying_flatten_args)
    # Tasks declare the keyword only when Ray's tracing is on: declare it here otherwise.
    patch(ray.remote_function, "_inject_tracing_into_function", _declaring_inject)
    patch(function_manager.FunctionActorManager, "_make_actor_method_executor", _carried_executor_maker)
    patch(ray.exceptions.RayTaskError, "as_instanceof_cause", _arriving_failure)
    patch(ray.actor, "exit_actor", _flushing_exit_actor)


class _PatchWhenImported(importlib.abc.MetaPathFinder):
    """Patches Ray once its package has been imported (one shot, then out of the path)."""

    def __init__(self, patch: Patch) -> None:
        self._patch = patch

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != RAY_PACKAGE:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            with guard("ng_otel.integrations.ray.patch"):
                _patch_ray(self._patch)

        loader.exec_module = exec_then_patch
        return spec


def instrument() -> None:
    """Patch Ray's seams in this process (the driver's, or a worker's before it runs a task);
    idempotent, never raises. ``enable()`` is what makes them record and carry."""
    with guard("ng_otel.integrations.ray.instrument"):
        patch_framework(_patch)


def uninstrument() -> None:
    """Undo what ``instrument()`` patched."""
    while _PATCHED:
        owner, name, original = _PATCHED.pop()
        setattr(owner, name, original)


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: ng_otel in every worker of the job, before any task.

    ``ray.init(runtime_env={"worker_process_setup_hook": "ng_otel.integrations.ray.setup_worker"})``
    """
    from ng_otel.otel.providers import enable

    if enable(default_service_name=DEFAULT_WORKER_SERVICE) is not None:
        instrument()


def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = owner.__dict__.get(name)
    if original is None or getattr(original, "_ng_otel_patched", False):
        return  # absent in this Ray, or patched already (by the instrumentor, or before)
    patched = make(original)
    patched._ng_otel_patched = True
    setattr(owner, name, patched)
    _PATCHED.append((owner, name, original))


# -- the caller: carry the context -----------------------------------------------------------


def _carrying_flatten_args(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def flatten_args(signature_parameters: Any, args: Any, kwargs: Any) -> Any:
        if is_enabled():
            kwargs = _with_carrier(signature_parameters, kwargs)
        return original(signature_parameters, args, kwargs)

    return flatten_args


def _with_carrier(signature_parameters: Any, kwargs: Any) -> Any:
    with guard("ng_otel.integrations.ray.carry"):
        if kwargs and KEYWORD in kwargs:
            return kwargs  # Ray's tracing or another carrier put the context there: never twice
        if not any(parameter.name == KEYWORD for parameter in signature_parameters):
            return kwargs  # a callee that takes no carrier (a generator method, a cross-language one)
        if not trace.get_current_span().get_span_context().is_valid:
            return kwargs
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if carrier:
            return {**(kwargs or {}), KEYWORD: carrier}
    return kwargs


def _declaring_inject(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def _inject_tracing_into_function(function: Any) -> Any:
        from ray.util.tracing import tracing_helper  # type: ignore[import-not-found, unused-ignore]

        if tracing_helper._is_tracing_enabled() or not callable(function):
            return original(function)  # Ray's own wrapper takes the keyword
        return _task_taking_carrier(function, tracing_helper._add_param_to_signature)

    return _inject_tracing_into_function


def _task_taking_carrier(function: Any, add_param: Callable[[Any, inspect.Parameter], Any]) -> Any:
    """``function`` taking the carrier keyword, as Ray's own hook wraps it. The wrapper is
    pickled with the task, by value: it imports this module only when it runs, so a worker
    without ng_otel runs the task as it would without ng_otel."""

    @functools.wraps(function)
    def with_carrier(*args: Any, _ray_trace_ctx: Any = None, **kwargs: Any) -> Any:
        try:
            from ng_otel.integrations.ray import run_carried
        except ImportError:
            return function(*args, **kwargs)
        return run_carried(_ray_trace_ctx, function, args, kwargs)

    keyword = inspect.Parameter(KEYWORD, inspect.Parameter.KEYWORD_ONLY, default=None)
    with_carrier.__signature__ = add_param(function, keyword)  # type: ignore[attr-defined]
    return with_carrier


# -- the callee: make it current; let failures cross intact ----------------------------------


def _carried_executor_maker(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _make_actor_method_executor(self: Any, method_name: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        executor = original(self, method_name, method, *args, **kwargs)
        with guard("ng_otel.integrations.ray.executor"):
            return _carried_executor(executor, method)
        return executor

    return _make_actor_method_executor


def _carried_executor(executor: Any, method: Any) -> Any:
    """``executor`` run under the carried context; Ray reads ``name`` and ``method`` off it to
    pick how to run it (an ``async def`` method in the actor's event loop)."""
    if inspect.iscoroutinefunction(method):

        def run(actor: Any, *args: Any, **kwargs: Any) -> Any:
            return _run_carried_async(kwargs.get(KEYWORD), executor, (actor, *args), kwargs)

    else:

        def run(actor: Any, *args: Any, **kwargs: Any) -> Any:
            return run_carried(kwargs.get(KEYWORD), executor, (actor, *args), kwargs)

    functools.update_wrapper(run, executor)
    run.name = getattr(executor, "name", None)  # type: ignore[attr-defined]
    run.method = getattr(executor, "method", method)  # type: ignore[attr-defined]
    return run


def run_carried(carrier: Any, call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``call(*args, **kwargs)`` under the caller's context from ``carrier``; a Gym failure it
    raises leaves ready to cross (``_prepare_to_cross``)."""
    token = _attach(carrier)
    try:
        return call(*args, **kwargs)
    except BaseException as error:
        _prepare_to_cross(error)
        raise
    finally:
        _detach(token)


async def _run_carried_async(
    carrier: Any, call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    token = _attach(carrier)  # inside the coroutine: the context it runs in
    try:
        return await call(*args, **kwargs)
    except BaseException as error:
        _prepare_to_cross(error)
        raise
    finally:
        _detach(token)


@guarded
def _attach(carrier: Any) -> object:
    # Where Ray's tracing is on, its wrapper inside makes the same context current again for
    # the method, under its consumer span; this one is what a failure escaping it is recorded in.
    if not isinstance(carrier, dict) or not is_enabled():
        return None
    return otel_context.attach(propagate.extract(carrier))


@guarded
def _detach(token: Any) -> None:
    if token is not None:
        otel_context.detach(token)


@guarded
def _prepare_to_cross(error: BaseException) -> None:
    """Record the Gym failure in ``error`` as this call's own (known events add nothing), and
    put on it where each event of its chain was recorded, for the caller. What this process
    recorded now is flushed first; if the flush does not finish in time those events are not
    claimed, so the caller exports them rather than link to spans that may never arrive."""
    if not is_enabled() or not isinstance(error, NgFailureEvent):
        return  # only an NgFailureEvent carries its chain through a pickle
    report = failure_report_for(error)
    if report is None:
        return
    recorder = get_recorder()
    known = recorder.index.recorded_at(report.events)
    if recorder.record(report, own=True) and _flushed(FLUSH_BEFORE_CROSSING_MILLIS):
        known = recorder.index.recorded_at(report.events)
    if known:
        error.recorded_at = known


def _flushed(timeout_millis: int) -> bool:
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    return force_flush is None or bool(force_flush(timeout_millis))


# -- the caller again: what ray.get raises ---------------------------------------------------


def _arriving_failure(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def as_instanceof_cause(self: Any) -> Any:
        cause = getattr(self, "cause", None)
        if not isinstance(cause, NgFailureEvent):
            return original(self)
        # Ray's dual class cannot take NgFailureEvent (its ``cause`` property has no setter):
        # Ray would log a WARNING and raise this RayTaskError itself. Raise it without the try.
        _arrived(self, cause)
        return self

    return as_instanceof_cause


@guarded
def _arrived(task_error: BaseException, cause: NgFailureEvent) -> None:
    """The failure is the RayTaskError's explicit cause, so a failure raised ``from`` it is
    caused by the actor's; where the actor recorded each event is learned, so those are linked
    to, never exported again here."""
    if task_error.__cause__ is None:
        task_error.__cause__ = cause
    recorded_at = cause.recorded_at
    if not recorded_at or not is_enabled():
        return
    report = failure_report_for(cause)
    if report is None:
        return
    try:
        contexts = decode_context_map(dict(recorded_at))
    except ValueError:
        return  # not what an adapter wrote: the events are exported here instead
    get_recorder().learn_remote(report, contexts)


def failure_class(error: BaseException) -> FailureClass | None:
    """INFRA or DATA for the Gym failure in what ``ray.get`` raised (its kind and HTTP status,
    as NeMo-RL's ``http_status_is_infra`` decides a status); ``None`` when it holds none."""
    failure = find_boundary_failure(error)
    if failure is None:
        cause = getattr(error, "cause", None)  # a RayTaskError this process did not patch
        failure = find_boundary_failure(cause) if isinstance(cause, BaseException) else None
    view = gym_event_view(failure) if isinstance(failure, BaseException) else None
    if view is None:
        return None
    return DEFAULT_CLASSIFIER.classify(view.failure_kind, view.http_status)


# -- exits -----------------------------------------------------------------------------------


def _flushing_exit_actor(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def exit_actor(*args: Any, **kwargs: Any) -> Any:
        _flush_before_exit()
        return original(*args, **kwargs)

    return exit_actor


@guarded
def _flush_before_exit() -> None:
    if is_enabled():
        from ng_otel.otel.providers import flush

        flush(FLUSH_BEFORE_EXIT_MILLIS)


__all__ = [
    "FLUSH_BEFORE_CROSSING_MILLIS",
    "FLUSH_BEFORE_EXIT_MILLIS",
    "KEYWORD",
    "failure_class",
    "instrument",
    "patch_framework",
    "run_carried",
    "setup_worker",
    "uninstrument",
]
