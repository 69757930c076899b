"""Thin adapters, one per framework: each imports its framework and nothing else does.

A framework is added by one adapter module that defines ``patch_framework(patch)`` and one
entry in ``FRAMEWORKS``, which both the ``opentelemetry-instrument`` entry point and
``ng-otel doctor`` read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["FRAMEWORKS", "Framework", "Patch", "instrument_app"]

Patch = Callable[[Any, str, Callable[[Any], Any]], None]
"""``patch(owner, name, make)``: replace ``owner.name`` with ``make(original)``, undoably
(the instrumentor undoes every patch on ``uninstrument``)."""


@dataclass(frozen=True)
class Framework:
    """``distributions``: what ``doctor`` reports as installed or not; ``adapter``: the module
    whose ``patch_framework(patch)`` the no-code path calls when it imports."""

    distributions: tuple[str, ...]
    adapter: str


FRAMEWORKS: Final = (
    Framework(("starlette", "fastapi"), "ng_otel.integrations.asgi"),
    Framework(("aiohttp",), "ng_otel.integrations.aiohttp"),
    Framework(("ray",), "ng_otel.integrations.ray"),
)


def instrument_app(app: Any, **options: Any) -> Any:
    """One line for a FastAPI or Starlette app, before it serves: ng_otel's layers are placed
    when the app builds its middleware stack, around whatever middleware it has by then
    (``options`` go to ``FailureReportMiddleware``)."""
    from ng_otel.integrations.asgi import add_failure_layers

    build = app.build_middleware_stack

    def build_middleware_stack() -> Any:
        add_failure_layers(app, **options)
        return build()

    app.build_middleware_stack = build_middleware_stack
    return app
