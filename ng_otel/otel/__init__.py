"""The OpenTelemetry mapping: Gym failures as span events, cause links and bounded metrics.

Knows the contract and OpenTelemetry, no web framework. ``names`` owns every attribute and
metric name; ``enable`` (``providers``) turns it on; the recorder does the mapping.
"""

from ng_otel.otel import names
from ng_otel.otel.providers import enable, flush, shutdown
from ng_otel.otel.recorder import FailureRecorder, get_recorder, is_enabled, observe_failure, record_failure
from ng_otel.otel.settings import Settings

__all__ = [
    "FailureRecorder",
    "Settings",
    "enable",
    "flush",
    "get_recorder",
    "is_enabled",
    "names",
    "observe_failure",
    "record_failure",
    "shutdown",
]
