"""ng_otel: NeMo Gym failures as OpenTelemetry span events, links and metrics.

The contract names import eagerly and cheaply; the telemetry names load OpenTelemetry only
when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ng_otel._version import __version__
from ng_otel.contract import (
    FAILURE_KINDS,
    FailureReport,
    ForeignError,
    NgFailureEvent,
    failure_report_for,
    find_boundary_failure,
    rebuild_failure,
    validate_failure_kind,
)

if TYPE_CHECKING:
    from ng_otel.gym.deployment import enable
    from ng_otel.otel.recorder import observe_failure, record_failure

_TELEMETRY = {
    "enable": "ng_otel.gym.deployment",
    "record_failure": "ng_otel.otel.recorder",
    "observe_failure": "ng_otel.otel.recorder",
}


def __getattr__(name: str) -> Any:
    module = _TELEMETRY.get(name)
    if module is None:
        raise AttributeError(f"module 'ng_otel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "FAILURE_KINDS",
    "FailureReport",
    "ForeignError",
    "NgFailureEvent",
    "__version__",
    "enable",
    "failure_report_for",
    "find_boundary_failure",
    "observe_failure",
    "rebuild_failure",
    "record_failure",
    "validate_failure_kind",
]
