"""``enable()``: one call that turns ng_otel on in a server.

Providers the application (or Gym's own telemetry) already installed are reused. Where NeMo
Gym's own telemetry is switched on, it installs the providers itself once the server starts,
which is after ``opentelemetry-instrument`` enabled ng_otel: ng_otel then installs none and
records through the global providers, whatever they become. Otherwise
SDK providers are installed with exporters chosen by the standard ``OTEL_*`` variables
(``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER``, ``OTEL_LOGS_EXPORTER``:
``otlp`` (default), ``console`` or ``none``; ``OTEL_EXPORTER_OTLP_[SIGNAL_]PROTOCOL``:
``http/protobuf`` (default) or ``grpc``; endpoints, headers and timeouts are read by the
exporters themselves). ``OTEL_SDK_DISABLED=true`` installs nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry._logs import LoggerProvider, get_logger_provider, set_logger_provider
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from ng_otel._version import __version__
from ng_otel.otel import names
from ng_otel.otel._guard import guarded
from ng_otel.otel.export import LossCountingSpanExporter
from ng_otel.otel.recorder import FailureRecorder, install_recorder
from ng_otel.otel.settings import Settings

_log = logging.getLogger("ng_otel")
SDK_SELF_METRICS = "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED"
_lock = threading.Lock()
_installed: FailureRecorder | None = None
_owned: list[Any] = []  # providers enable() created, flushed and shut down by shutdown()

# NeMo Gym 0.7.0 (nemo_gym/telemetry/setup.py, is_telemetry_env_enabled): the first of these
# that is set decides, and its telemetry needs nemo-lens to run at all.
GYM_TELEMETRY_SWITCHES = ("NEMO_GYM_OTEL_ENABLED", "NEMO_LENS_ENABLED")
_GYM_TRUTHY = ("1", "true", "yes", "on")
GYM_SERVER_NAME = "NEMO_GYM_CONFIG_PATH"  # set by Gym in each server process it starts


@guarded
def enable(
    service_name: str | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    logger_provider: LoggerProvider | None = None,
    **overrides: Any,
) -> FailureRecorder | None:
    """Turn ng_otel on for this process; idempotent (a second call returns the first recorder).

    ``overrides`` are settings (``enabled``, ``signals``, ``max_kinds``, ``link_index_size``)
    and win over ``NG_OTEL_*`` variables. Returns ``None`` when disabled. Never raises.
    """
    global _installed
    with _lock:
        if _installed is not None:
            return _installed
        try:
            settings = Settings.from_env(**overrides)
        except (TypeError, ValueError) as error:
            _log.warning("ng_otel: not enabled: %s", error)
            return None
        if not settings.enabled:
            install_recorder(None, enabled=False)
            return None
        sdk_disabled = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
        gym_owned = not sdk_disabled and gym_telemetry_installs_providers()
        if gym_owned:
            _log.info("ng_otel: NeMo Gym's telemetry is on; ng_otel records through the providers it installs")
        # No resource: install no provider, record through whatever the global ones become.
        resource = None if sdk_disabled or gym_owned else _resource(service_name)
        # Metrics first: the span and log pipelines report what they drop through it, so no
        # loss is silent.
        meter_provider = meter_provider or _meter_provider(resource)
        tracer_provider = tracer_provider or _tracer_provider(resource, meter_provider)
        if "logs" in settings.signals:
            logger_provider = logger_provider or _logger_provider(resource, meter_provider)
        if resource is not None:
            _flush_on_sigterm()
            _quiet_repeated_sdk_warnings()
        recorder = FailureRecorder(
            tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE, __version__),
            meter_provider.get_meter(names.INSTRUMENTATION_SCOPE, __version__),
            logger_provider.get_logger(names.INSTRUMENTATION_SCOPE, __version__) if logger_provider else None,
            settings,
        )
        install_recorder(recorder)
        _installed = recorder
        return recorder


def gym_telemetry_installs_providers() -> bool:
    """True where NeMo Gym's own telemetry is switched on and can run (nemo-lens is
    installed): it installs this process's providers when the Gym server starts."""
    for name in GYM_TELEMETRY_SWITCHES:
        raw = os.environ.get(name, "").strip().lower()
        if raw:
            return raw in _GYM_TRUTHY and _lens_installed()
    return False


def _lens_installed() -> bool:
    try:
        return importlib.util.find_spec("nemo.lens") is not None
    except (ImportError, ValueError):
        return False


@contextmanager
def _pipeline_self_metrics() -> Iterator[None]:
    """The SDK counts what a queue drops and an exporter fails to send only when
    ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED`` is true while that pipeline is built. It also
    reads the variable for every tracer (and logger provider) built later, whose per-span
    metrics cost about 20 µs a span in every instrumentation of the process. So it is on
    while ``enable()`` builds exporters, processors and readers, and left as the user set it
    everywhere else."""
    if SDK_SELF_METRICS in os.environ:
        yield
        return
    os.environ[SDK_SELF_METRICS] = "true"
    try:
        yield
    finally:
        os.environ.pop(SDK_SELF_METRICS, None)


def _resource(service_name: str | None) -> Any:
    """``service_name``, else the standard ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES``,
    else the server's name in Gym's config: every server process Gym starts shares one
    environment, so that is what tells them apart."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create({SERVICE_NAME: service_name} if service_name else {})
    gym_server = os.environ.get(GYM_SERVER_NAME, "").strip()
    if gym_server and str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: gym_server}))
    return resource


def _exporter_choice(signal: str) -> str:
    return os.environ.get(f"OTEL_{signal}_EXPORTER", "otlp").strip().lower() or "otlp"


_OTLP_EXPORTERS = {
    ("traces", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "OTLPSpanExporter"),
    ("traces", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"),
    ("metrics", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter", "OTLPMetricExporter"),
    ("metrics", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "OTLPMetricExporter"),
    ("logs", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc._log_exporter", "OTLPLogExporter"),
    ("logs", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http._log_exporter", "OTLPLogExporter"),
}
_CONSOLE_EXPORTERS = {
    "traces": ("opentelemetry.sdk.trace.export", "ConsoleSpanExporter"),
    "metrics": ("opentelemetry.sdk.metrics.export", "ConsoleMetricExporter"),
    "logs": ("opentelemetry.sdk._logs.export", "ConsoleLogExporter"),
}


def _exporter(signal: str, **options: Any) -> Any:
    """The exporter ``OTEL_<SIGNAL>_EXPORTER`` and the OTLP protocol variables ask for, or
    ``None`` for ``none``. OTLP exporters report their failures through ``meter_provider``."""
    choice = _exporter_choice(signal.upper())
    if choice == "otlp":
        protocol = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        module, name = _OTLP_EXPORTERS[(signal, "grpc" if protocol.strip().lower() == "grpc" else "http/protobuf")]
        return getattr(importlib.import_module(module), name)(**options)
    if choice == "console":
        module, name = _CONSOLE_EXPORTERS[signal]
        return getattr(importlib.import_module(module), name)()
    if choice != "none":
        _log.warning("ng_otel: OTEL_%s_EXPORTER=%s is not supported here; nothing is exported", signal.upper(), choice)
    return None


def _tracer_provider(resource: Any, meter_provider: MeterProvider) -> TracerProvider:
    current = trace.get_tracer_provider()
    if resource is None or not isinstance(current, trace.ProxyTracerProvider):
        return current
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = SdkTracerProvider(resource=resource)
    with _pipeline_self_metrics():
        exporter = _exporter("traces", meter_provider=meter_provider)
        if exporter is not None:
            lost = meter_provider.get_meter(names.INSTRUMENTATION_SCOPE, __version__).create_counter(
                names.UNEXPORTED_METRIC, unit=names.UNEXPORTED_UNIT, description=names.UNEXPORTED_DESCRIPTION
            )
            exporter = LossCountingSpanExporter(exporter, lost)
            # Bounded queue (OTEL_BSP_MAX_QUEUE_SIZE); what it drops is counted in
            # otel.sdk.processor.span.processed{error.type="queue_full"}.
            provider.add_span_processor(BatchSpanProcessor(exporter, meter_provider=meter_provider))
    trace.set_tracer_provider(provider)
    _owned.append(provider)
    return provider


def _meter_provider(resource: Any) -> MeterProvider:
    current = metrics.get_meter_provider()
    if resource is None or type(current).__name__ != "_ProxyMeterProvider":
        return current
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader

    readers: list[MetricReader] = []
    with _pipeline_self_metrics():  # readers count their collections once attached, below
        if _exporter_choice("METRICS") == "prometheus":
            readers.append(_prometheus_reader())
        else:
            exporter = _exporter("metrics")
            if exporter is not None:
                readers.append(PeriodicExportingMetricReader(exporter))
        provider = SdkMeterProvider(resource=resource, metric_readers=readers)
    metrics.set_meter_provider(provider)
    _owned.append(provider)
    return provider


def _prometheus_reader() -> Any:
    """A pull endpoint for Prometheus on ``OTEL_EXPORTER_PROMETHEUS_HOST``:``..._PORT``
    (default localhost:9464); needs the ``prometheus`` extra."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import start_http_server

    host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
    port = int(os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464"))
    start_http_server(port, addr=host)
    return PrometheusMetricReader()


def _logger_provider(resource: Any, meter_provider: MeterProvider) -> LoggerProvider:
    current = get_logger_provider()
    if resource is None or type(current).__name__ != "ProxyLoggerProvider":
        return current
    from opentelemetry.sdk._logs import LoggerProvider as SdkLoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    provider = SdkLoggerProvider(resource=resource)
    with _pipeline_self_metrics():
        exporter = _exporter("logs", meter_provider=meter_provider)
        if exporter is not None:
            provider.add_log_record_processor(BatchLogRecordProcessor(exporter, meter_provider=meter_provider))
    set_logger_provider(provider)
    _owned.append(provider)
    return provider


class RepeatLimit(logging.Filter):
    """Lets one WARNING through per ``interval`` seconds, ERRORs always. With the collector
    down, the SDK warns once per dropped span, on the request's own thread; a filter alone
    still pays for building each record (about 4 µs), so once a warning has passed, the
    logger's level is raised to ERROR for the interval and a repeat costs a level check.
    The drops are counted in ``otel.sdk.processor.span.processed{error.type="queue_full"}``
    meanwhile."""

    def __init__(self, logger: logging.Logger, interval: float = 60.0) -> None:
        super().__init__()
        self.interval = interval
        self._logger = logger
        self._quiet = False
        self._level = logger.level
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        with self._lock:
            if self._quiet:
                return False  # built before the raised level took effect
            self._quiet, self._level = True, self._logger.level
        self._logger.setLevel(logging.ERROR)
        reopen = threading.Timer(self.interval, self._reopen)
        reopen.daemon = True
        reopen.start()
        return True

    def _reopen(self) -> None:
        with self._lock:
            if self._logger.level == logging.ERROR:  # unless someone set another level meanwhile
                self._logger.setLevel(self._level)
            self._quiet = False


def _quiet_repeated_sdk_warnings() -> None:
    logger = logging.getLogger("opentelemetry.sdk._shared_internal")
    if not any(isinstance(existing, RepeatLimit) for existing in logger.filters):
        logger.addFilter(RepeatLimit(logger))


def _flush_on_sigterm() -> None:
    """SIGTERM's default action ends a process without running ``atexit``, losing what the
    batch processors still hold. When nobody handles SIGTERM, flush first (bounded by the
    exporters' timeouts), then end the process as SIGTERM would. Servers that handle SIGTERM
    themselves (uvicorn) restore this handler and re-raise once they have shut down."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def flush_then_terminate(signum: int, frame: Any) -> None:
        shutdown()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, flush_then_terminate)


@guarded
def flush(timeout_millis: int = 5_000) -> None:
    """Export what the providers hold now (spans, metrics, logs), bounded by the timeout."""
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider(), get_logger_provider(), *_owned):
        force_flush = getattr(provider, "force_flush", None)
        if force_flush is not None:
            force_flush(timeout_millis)


@guarded
def shutdown() -> None:
    """Flush and shut down the providers ``enable()`` created; others belong to the app."""
    global _installed
    with _lock:
        for provider in _owned:
            provider.shutdown()
        _owned.clear()
        _installed = None
        install_recorder(None)
