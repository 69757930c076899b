"""Private parts of the OpenTelemetry SDK that ng_otel relies on, reached from here only.

Each is checked by ``tests/test_sdk_compat.py``, which fails naming the part when an SDK
release moves it, and CI runs that test on the lowest SDK the package admits and the newest.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

from opentelemetry.sdk.environment_variables import OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED

# The modules whose batch processors read the self-metrics switch when they are built, each
# through its own imported ``parse_boolean_environment_variable``.
PROCESSOR_MODULES: Final = ("opentelemetry.sdk.trace.export", "opentelemetry.sdk._logs._internal.export")
SWITCH_READER: Final = "parse_boolean_environment_variable"
_patch_lock = threading.Lock()


@contextmanager
def processor_self_metrics() -> Iterator[None]:
    """Batch processors built inside count what their queues drop (``otel.sdk.processor.*``).

    The SDK has no argument for that, only ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED`` read as a
    processor is built, and every tracer built later reads it too (its per-span metrics cost
    ~20 µs a span in every instrumentation of the process). Here the processors' modules read
    it as true, and ``os.environ`` is never touched, so no other thread sees it change."""
    with _patch_lock:
        originals: list[tuple[Any, Callable[..., bool]]] = []
        for name in PROCESSOR_MODULES:
            module = importlib.import_module(name)
            original = getattr(module, SWITCH_READER)
            originals.append((module, original))
            setattr(module, SWITCH_READER, _reading_self_metrics_as_true(original))
        try:
            yield
        finally:
            for module, original in originals:
                setattr(module, SWITCH_READER, original)


def _reading_self_metrics_as_true(original: Callable[..., bool]) -> Callable[..., bool]:
    def read(name: str, *args: Any, **kwargs: Any) -> bool:
        return True if name == OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED else original(name, *args, **kwargs)

    return read
