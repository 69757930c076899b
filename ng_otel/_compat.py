"""Every private part of another library that ng_otel relies on, reached from here only:
OpenTelemetry's proxy providers, its SDK's exporter entry points, span internals and
self-metrics switch, the API's ``SpanContext`` layout, and Starlette's exception-handler table.

Each is checked by ``tests/test_compat.py``, which fails naming the part when a release moves
it; CI runs it on the lowest OpenTelemetry SDK the package admits and on the newest. Nothing
here imports a web framework: Starlette's part is an attribute name.
"""

from __future__ import annotations

import importlib
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

from opentelemetry._logs._internal import ProxyLoggerProvider
from opentelemetry.metrics._internal import _ProxyMeterProvider
from opentelemetry.sdk.environment_variables import OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED
from opentelemetry.trace import DEFAULT_TRACE_STATE, SpanContext, TraceFlags

# The modules whose batch processors read the self-metrics switch when they are built, each
# through its own imported ``parse_boolean_environment_variable``.
PROCESSOR_MODULES: Final = ("opentelemetry.sdk.trace.export", "opentelemetry.sdk._logs._internal.export")
SWITCH_READER: Final = "parse_boolean_environment_variable"
_patch_lock = threading.Lock()

# Where the SDK's batch processors warn of every span their full queue drops.
SDK_DROP_WARNINGS_LOGGER: Final = "opentelemetry.sdk._shared_internal"

# What the API hands out before a provider is installed: none installed yet, where it is one.
ProxyMeterProvider: Final = _ProxyMeterProvider

__all__ = [
    "SDK_DROP_WARNINGS_LOGGER",
    "ProxyLoggerProvider",
    "ProxyMeterProvider",
    "exception_handlers_of",
    "exporter_classes_named",
    "processor_self_metrics",
    "span_room",
]


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


# -- the SDK's exporter entry points (what OTEL_<SIGNAL>_EXPORTER names) ------------------------


def exporter_classes_named(names: list[str], signal_name: str) -> list[type]:
    """The exporter classes ``names`` resolve to for ``signal_name``, as the SDK's own
    configurator resolves them (entry points, the OTLP protocol variables)."""
    from opentelemetry.sdk._configuration import _get_exporter_entry_point, _import_config_components

    entry_points = [_get_exporter_entry_point(name, signal_name) for name in names]  # type: ignore[arg-type]
    return [impl for _, impl in _import_config_components(entry_points, f"opentelemetry_{signal_name}_exporter")]


# -- a span's room ---------------------------------------------------------------------------


def span_room(span: Any) -> tuple[float, float]:
    """How many more events and links ``span`` keeps: the SDK's ``SpanLimits``
    (``OTEL_SPAN_EVENT_COUNT_LIMIT``, ``OTEL_SPAN_LINK_COUNT_LIMIT``, 128 each by default) less
    what it holds; unbounded for a span that is not the SDK's. Its own bounded lists, not its
    ``events``/``links`` properties, which copy them on every read: recording onto a busy
    span would be quadratic."""
    limits = getattr(span, "_limits", None)
    if limits is None:
        return math.inf, math.inf
    held_events = getattr(span, "_events", ())
    held_links = getattr(span, "_links", ())
    events = math.inf if limits.max_events is None else limits.max_events - len(held_events)
    links = math.inf if limits.max_links is None else limits.max_links - len(held_links)
    return events, links


# -- a span context as plain numbers ---------------------------------------------------------

PlainSpanContext = tuple[int, int, int, bool]
"""(trace id, span id, trace flags, is remote): a tuple of numbers, which the garbage collector
stops tracking, where a ``SpanContext`` (and its ``TraceFlags``) stays tracked for life."""

_SAMPLED, _NOT_SAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)


def _flags(value: int) -> TraceFlags:
    return _SAMPLED if value == TraceFlags.SAMPLED else _NOT_SAMPLED if value == 0 else TraceFlags(value)


def _plain_by_fields(context: SpanContext) -> PlainSpanContext | None:
    if context.is_valid and (context.trace_state is DEFAULT_TRACE_STATE or not context.trace_state):
        return context.trace_id, context.span_id, int(context.trace_flags), context.is_remote
    return None


def _context_by_fields(plain: PlainSpanContext) -> SpanContext:
    trace_id, span_id, flags, is_remote = plain
    return SpanContext(trace_id, span_id, is_remote, _flags(flags))


def _plain_by_layout(context: SpanContext) -> PlainSpanContext | None:
    trace_id, span_id, is_remote, trace_flags, trace_state, is_valid = context
    if is_valid and (trace_state is DEFAULT_TRACE_STATE or not trace_state):
        return trace_id, span_id, int(trace_flags), is_remote
    return None


def _context_by_layout(plain: PlainSpanContext) -> SpanContext:
    trace_id, span_id, flags, is_remote = plain
    return tuple.__new__(SpanContext, (trace_id, span_id, is_remote, _flags(flags), DEFAULT_TRACE_STATE, True))


def _layout_holds() -> bool:
    """``SpanContext`` is the tuple (trace_id, span_id, is_remote, trace_flags, trace_state,
    is_valid): its properties read those places. Read through them, a link index read costs
    a dozen Python calls more per event."""
    context = SpanContext(1, 2, True, _SAMPLED)
    return (
        isinstance(context, tuple)
        and tuple(context) == (1, 2, True, _SAMPLED, DEFAULT_TRACE_STATE, True)
        and _context_by_layout((1, 2, 1, True)) == context
    )


LAYOUT_HOLDS: Final = _layout_holds()
plain_span_context: Callable[[SpanContext], PlainSpanContext | None] = (
    _plain_by_layout if LAYOUT_HOLDS else _plain_by_fields
)
"""The numbers of a valid ``context`` with no trace state; ``None`` for any other."""
span_context_of: Callable[[PlainSpanContext], SpanContext] = _context_by_layout if LAYOUT_HOLDS else _context_by_fields
"""The ``SpanContext`` that ``plain_span_context`` took apart, equal to it."""


# -- Starlette --------------------------------------------------------------------------------

STARLETTE_HANDLERS: Final = "_exception_handlers"  # ExceptionMiddleware's table, applied by its routes


def exception_handlers_of(node: Any) -> dict[Any, Any] | None:
    """The exception-handler table of a built Starlette ``ExceptionMiddleware``, else ``None``."""
    handlers = getattr(node, STARLETTE_HANDLERS, None)
    return handlers if isinstance(handlers, dict) else None
