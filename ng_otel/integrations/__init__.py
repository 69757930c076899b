"""Thin adapters, one per framework: each imports its framework and nothing else does."""

from __future__ import annotations

from typing import Any

__all__ = ["instrument_app"]


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
