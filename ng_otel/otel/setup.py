"""``enable()``: one call that turns ng_otel on in a server.

Providers the application (or Gym's own telemetry) already installed are reused; otherwise
SDK providers are installed with exporters chosen by the standard ``OTEL_*`` variables
(``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER``, ``OTEL_LOGS_EXPORTER``:
``otlp`` (default), ``console`` or ``none``; ``OTEL_EXPORTER_OTLP_[SIGNAL_]PROTOCOL``:
``http/protobuf`` (default) or ``grpc``; endpoints, headers and timeouts are read by the
exporters themselves). ``OTEL_SDK_DISABLED=true`` installs nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry._logs import LoggerProvider, get_logger_provider, set_logger_provider
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from ng_otel._version import __version__
from ng_otel.otel import names
from ng_otel.otel._guard import guarded
from ng_otel.otel.recorder import FailureRecorder, install_recorder
from ng_otel.otel.settings import Settings

_log = logging.getLogger("ng_otel")
_lock = threading.Lock()
_installed: FailureRecorder | None = None
_owned: list[Any] = []  # providers enable() created, flushed and shut down by shutdown()


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
        resource = None if sdk_disabled else _resource(service_name)
        tracer_provider = tracer_provider or _tracer_provider(resource)
        meter_provider = meter_provider or _meter_provider(resource)
        if "logs" in settings.signals:
            logger_provider = logger_provider or _logger_provider(resource)
        recorder = FailureRecorder(
            tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE, __version__),
            meter_provider.get_meter(names.INSTRUMENTATION_SCOPE, __version__),
            logger_provider.get_logger(names.INSTRUMENTATION_SCOPE, __version__) if logger_provider else None,
            settings,
        )
        install_recorder(recorder)
        _installed = recorder
        return recorder


def _resource(service_name: str | None) -> Any:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    return Resource.create({SERVICE_NAME: service_name} if service_name else {})


def _exporter_choice(signal: str) -> str:
    return os.environ.get(f"OTEL_{signal}_EXPORTER", "otlp").strip().lower() or "otlp"


def _protocol(signal: str) -> str:
    value = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    return (value or "http/protobuf").strip().lower()


def _tracer_provider(resource: Any) -> TracerProvider:
    current = trace.get_tracer_provider()
    if resource is None or not isinstance(current, trace.ProxyTracerProvider):
        return current
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = SdkTracerProvider(resource=resource)
    choice = _exporter_choice("TRACES")
    if choice == "otlp":
        if _protocol("TRACES") == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif choice == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    _owned.append(provider)
    return provider


def _meter_provider(resource: Any) -> MeterProvider:
    current = metrics.get_meter_provider()
    if resource is None or type(current).__name__ != "_ProxyMeterProvider":
        return current
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricReader, PeriodicExportingMetricReader

    readers: list[MetricReader] = []
    choice = _exporter_choice("METRICS")
    if choice == "otlp":
        if _protocol("METRICS") == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
                OTLPMetricExporter,
            )
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    elif choice == "console":
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    elif choice == "prometheus":
        readers.append(_prometheus_reader())
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


def _logger_provider(resource: Any) -> LoggerProvider:
    current = get_logger_provider()
    if resource is None or type(current).__name__ != "ProxyLoggerProvider":
        return current
    from opentelemetry.sdk._logs import LoggerProvider as SdkLoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogExporter

    provider = SdkLoggerProvider(resource=resource)
    choice = _exporter_choice("LOGS")
    if choice == "otlp":
        if _protocol("LOGS") == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        else:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter  # type: ignore[assignment]
        provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
    elif choice == "console":
        provider.add_log_record_processor(BatchLogRecordProcessor(ConsoleLogExporter()))
    set_logger_provider(provider)
    _owned.append(provider)
    return provider


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
