"""``opentelemetry-instrument`` support: every framework in ``integrations.FRAMEWORKS`` that
is installed gets ng_otel with no code change, and a Gym deployment's processes get Gym's
rules (entry point ``opentelemetry_instrumentor`` named ``ng_otel``; disable it with
``NG_OTEL_ENABLED=0`` or ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=ng_otel``).

It sits above ``integrations`` and ``gym``: the one place that knows both.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from ng_otel.gym import deployment
from ng_otel.integrations import FRAMEWORKS, Framework
from ng_otel.otel._guard import guarded

_PATCHED: list[tuple[Any, str, Any]] = []


class NgOtelInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # each framework is patched only when it is installed

    def _instrument(self, **kwargs: Any) -> None:
        recorder = deployment.enable_for_process()
        if recorder is None:
            return
        for framework in FRAMEWORKS:
            patch_framework(framework)
        if not recorder.settings.send_receive_spans:
            leave_out_send_receive_spans()

    def _uninstrument(self, **kwargs: Any) -> None:
        deployment.uninstall()
        while _PATCHED:
            owner, name, original = _PATCHED.pop()
            setattr(owner, name, original)


@guarded
def patch_framework(framework: Framework) -> None:
    """Patch ``framework`` through its adapter, when the framework is installed."""
    try:
        adapter = importlib.import_module(framework.adapter)
    except ImportError:  # the framework is not installed: the adapter imports it first
        return
    adapter.patch_framework(patch)


@guarded
def leave_out_send_receive_spans() -> None:
    from ng_otel.integrations.asgi import leave_out_send_receive_spans

    leave_out_send_receive_spans(patch)


def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    """Replace ``owner.name`` (its own, not inherited) with ``make(original)``, once."""
    original = owner.__dict__.get(name)
    if original is None or getattr(original, "_ng_otel_patched", False):
        return
    patched = make(original)
    patched._ng_otel_patched = True
    setattr(owner, name, patched)
    _PATCHED.append((owner, name, original))
