"""``opentelemetry-instrument`` support: FastAPI/Starlette apps and aiohttp client sessions
get ng_otel with no code change (entry point ``opentelemetry_instrumentor`` named ``ng_otel``;
disable it with ``NG_OTEL_ENABLED=0`` or ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=ng_otel``).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from ng_otel.otel._guard import guarded
from ng_otel.otel.providers import enable, ray_processes_wanted, settle_providers

_PATCHED: list[tuple[Any, str, Any]] = []


class NgOtelInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # each framework is patched only when it is installed

    def _instrument(self, **kwargs: Any) -> None:
        from ng_otel.gym import deployment

        if deployment.is_ray_process() and not ray_processes_wanted():
            deployment.mark_ray_process()  # Ray's workers inherit Gym's environment; their telemetry is Ray's
            return
        process = deployment.gym_process()
        if enable(default_service_name=process.service_name if process is not None else None) is None:
            return
        deployment.install(process)
        _patch_asgi_apps()
        _patch_aiohttp_sessions()

    def _uninstrument(self, **kwargs: Any) -> None:
        from ng_otel.integrations import hooks

        hooks.reset()
        while _PATCHED:
            owner, name, original = _PATCHED.pop()
            setattr(owner, name, original)


def _patch(owner: Any, name: str, make: Any) -> None:
    original = owner.__dict__.get(name)
    if original is None or getattr(original, "_ng_otel_patched", False):
        return
    patched = make(original)
    patched._ng_otel_patched = True
    setattr(owner, name, patched)
    _PATCHED.append((owner, name, original))


@guarded
def _patch_asgi_apps() -> None:
    try:
        from starlette.applications import Starlette
    except ImportError:
        return
    from ng_otel.integrations.asgi import add_failure_layers

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def build_middleware_stack(self: Any) -> Any:
            settle_providers()  # by now a Gym server has run its own telemetry set-up
            add_failure_layers(self)
            return original(self)

        return build_middleware_stack

    for cls in _stack_builders(Starlette):
        _patch(cls, "build_middleware_stack", make)


def _stack_builders(base: type) -> list[type]:
    """``base`` and every subclass loaded now that defines its own ``build_middleware_stack``.

    FastAPI overrides Starlette's, and OpenTelemetry's FastAPI instrumentor replaces the name
    ``fastapi.FastAPI`` with a subclass of its own; the class to patch is the one that defines
    the method, wherever the public name points and whichever instrumentor loaded first."""
    try:
        import fastapi.applications  # noqa: F401  (loads FastAPI's class, the usual subclass)
    except ImportError:
        pass
    found, pending = [], [base]
    while pending:
        cls = pending.pop()
        if "build_middleware_stack" in cls.__dict__:
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


@guarded
def _patch_aiohttp_sessions() -> None:
    try:
        import aiohttp
    except ImportError:
        return
    from ng_otel.integrations.aiohttp import failure_trace_config

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, trace_configs: Any = None, **kwargs: Any) -> None:
            settle_providers()  # a process without a web app (collection) has run Gym's set-up by now
            configs = list(trace_configs or [])
            configs.append(failure_trace_config())
            original(self, *args, trace_configs=configs, **kwargs)

        return __init__

    _patch(aiohttp.ClientSession, "__init__", make)

    from ng_otel.integrations.aiohttp import attach_reply_evidence

    def make_raise_for_status(original: Any) -> Any:
        @functools.wraps(original)
        def raise_for_status(self: Any) -> None:
            try:
                original(self)
            except aiohttp.ClientResponseError as error:
                attach_reply_evidence(self, error)  # what the reply said, for the failure raised above
                raise

        return raise_for_status

    _patch(aiohttp.ClientResponse, "raise_for_status", make_raise_for_status)
