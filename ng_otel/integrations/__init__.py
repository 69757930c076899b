"""Thin adapters, one per framework: each imports its framework and nothing else does."""

from __future__ import annotations

from typing import Any


def instrument_app(app: Any, **options: Any) -> Any:
    """One line for a FastAPI or Starlette app: add ``FailureReportMiddleware``."""
    from ng_otel.integrations.asgi import FailureReportMiddleware

    app.add_middleware(FailureReportMiddleware, **options)
    return app
