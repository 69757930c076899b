"""JSON lines when OpenTelemetry is off: the minimum structured-log contract (Gym #3182).

Where no OpenTelemetry SDK records (no SDK tracer provider is installed, or
``OTEL_SDK_DISABLED=true``), or ``NG_OTEL_EXPORT=jsonl`` asks for them always, every failure
event, retry outcome and rollout outcome is one JSON object on one line, on stderr or the file
``NG_OTEL_JSONL_FILE`` names. docs/conventions.md, "JSON lines", lists every key: the record
it holds (``names.LINE_RECORD``), the time, the trace and span ids, and the record's fields.

A failure's fields are the span event's attributes, written by the one record -> attributes codec
(``ng_otel.otel.attributes.event_attributes``) and named by ``ng_otel.otel.names``; the
reason and foreign message are bounded as on the event (2000 characters). Trace and span ids
are written when the event has a valid span context. A line is written whole, under a lock,
and never raises into the caller (the guard logs once and drops it).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, Any, Final

import orjson
from opentelemetry import trace
from opentelemetry.trace import ProxyTracer, SpanContext, Tracer

from ng_otel.otel import names
from ng_otel.otel._guard import guarded
from ng_otel.otel.settings import Settings

STDERR: Final = frozenset({"", "-"})


def _sdk_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def _service_name() -> str | None:
    """The service the standard variables name, as the SDK reads them (``OTEL_SERVICE_NAME``,
    else ``OTEL_RESOURCE_ATTRIBUTES``, percent-decoded); ``None`` for the SDK's unknown one."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    name = str(Resource.create().attributes.get(SERVICE_NAME, ""))
    return None if not name or name.startswith("unknown_service") else name


class JsonLines:
    """Writes the JSON lines of one process; ``active`` says whether a line is due now."""

    def __init__(self, mode: str = "auto", path: str = "-", *, service: str | None = None) -> None:
        self.mode = mode
        self.path = path
        self.service = service if service is not None else _service_name()
        self._disabled = _sdk_disabled()
        self._lock = threading.Lock()
        self._stream: IO[bytes] | None = None
        self._tracer: object = None  # the tracer, and for a proxy the provider, the last answer was for
        self._settled: tuple[object, bool] | None = None  # the last answer, for a tracer that is no proxy
        self._provider: object = None
        self._answer = False

    def active(self, tracer: Tracer) -> bool:
        """True when a line is due: always in ``jsonl`` mode, never in ``otel``; in ``auto``
        when ``tracer`` (the recorder's) is no SDK tracer. A proxy tracer is the global
        provider's, checked against the provider installed now, so providers installed after
        start-up count."""
        settled = self._settled  # one read: (tracer, answer), replaced whole
        if settled is not None and settled[0] is tracer:  # no proxy: its answer never changes (read per event)
            return settled[1]
        if self.mode != "auto":
            return self.mode == "jsonl"
        if tracer is self._tracer:  # a proxy: its answer holds while the global provider does
            provider = trace.get_tracer_provider()
            if provider is self._provider:
                return self._answer
        self._tracer = tracer
        if isinstance(tracer, ProxyTracer):
            self._provider, self._settled = trace.get_tracer_provider(), None
            self._answer = self._disabled or not _is_sdk_provider(self._provider)
        else:
            self._answer = self._disabled or not _is_sdk_tracer(tracer)
            self._settled = (tracer, self._answer)
        return self._answer

    @guarded
    def write(self, record: str, attributes: Mapping[str, Any], context: SpanContext | None = None) -> None:
        line: dict[str, Any] = {names.LINE_RECORD: record, names.LINE_TIME: time.time_ns()}
        if context is not None and context.is_valid:
            line[names.LINE_TRACE_ID] = format(context.trace_id, "032x")
            line[names.LINE_SPAN_ID] = format(context.span_id, "016x")
        if self.service is not None:
            line[names.LINE_SERVICE] = self.service
        line.update(attributes)
        data = orjson.dumps(line, default=str) + b"\n"
        with self._lock:
            stream = self._stream if self._stream is not None else self._open()
            stream.write(data)
            stream.flush()

    def _open(self) -> IO[bytes]:
        if self.path.strip() in STDERR:
            stream: Any = getattr(sys.stderr, "buffer", None) or _TextAsBytes(sys.stderr)
            return stream  # type: ignore[no-any-return]  # stderr may be replaced (pytest's capture): looked up per line
        self._stream = open(self.path, "ab")  # held for the process's life
        return self._stream

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None


class _TextAsBytes:
    """A text stream without ``buffer`` (a test's StringIO), written as UTF-8 lines."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: bytes) -> int:
        return int(self._stream.write(data.decode("utf-8")) or 0)

    def flush(self) -> None:
        self._stream.flush()


def _is_sdk_provider(provider: object) -> bool:
    try:
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    except ImportError:  # pragma: no cover - the SDK is a dependency, but an environment may lack it
        return False
    return isinstance(provider, SdkTracerProvider)


def _is_sdk_tracer(tracer: object) -> bool:
    try:
        from opentelemetry.sdk.trace import Tracer as SdkTracer
    except ImportError:  # pragma: no cover
        return False
    return isinstance(tracer, SdkTracer)


def lines_for(settings: Settings) -> JsonLines | None:
    """The writer ``settings`` ask for (``None`` when ``NG_OTEL_EXPORT=otel``)."""
    if settings.export == "otel":
        return None
    return JsonLines(settings.export, settings.jsonl_file)


_lines: JsonLines | None = None
_lines_lock = threading.Lock()


def process_lines() -> JsonLines | None:
    """The process's writer, shared by the recorder and the recovery counters."""
    global _lines
    if _lines is None:
        with _lines_lock:
            if _lines is None:
                try:
                    settings = Settings.resolve()
                except ValueError:
                    settings = Settings()
                _lines = lines_for(settings) or JsonLines("otel")
    return _lines if _lines.mode != "otel" else None


def set_process_lines(lines: JsonLines | None) -> None:
    """Use ``lines`` from now on (``None``: build from the settings on next use; tests)."""
    global _lines
    with _lines_lock:
        _lines = lines
