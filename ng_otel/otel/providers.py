"""``enable()``: one call that turns ng_otel on in a server.

Providers the application (or ``opentelemetry-instrument``'s distro) already installed are
reused. Where the program installs its own providers once it starts (``defer_providers``:
NeMo Gym's telemetry does, after ``opentelemetry-instrument`` enabled ng_otel), ng_otel
installs none until ``settle_providers()`` and records through the global providers,
whatever they become. Otherwise SDK
providers are built with the exporters the standard variables name, resolved the way the SDK
resolves them (its ``opentelemetry_<signal>_exporter`` entry points, comma lists, the OTLP
protocol variables; ``otlp`` when unset), and installed only when every one of them could be
built. ``OTEL_SDK_DISABLED=true`` installs nothing.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from opentelemetry import metrics, trace
from opentelemetry._logs import LoggerProvider, get_logger_provider, set_logger_provider
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import ProxyTracerProvider, TracerProvider

from ng_otel._compat import (
    SDK_DROP_WARNINGS_LOGGER,
    ProxyLoggerProvider,
    ProxyMeterProvider,
    exporter_classes_named,
    processor_self_metrics,
)
from ng_otel._version import __version__
from ng_otel.contract.events import MAX_ID_CHARS
from ng_otel.contract.kinds import MAX_KIND_CHARS
from ng_otel.otel import names
from ng_otel.otel._guard import guarded
from ng_otel.otel.export import LossCountingSpanExporter
from ng_otel.otel.recorder import FailureRecorder, install_recorder
from ng_otel.otel.settings import Settings, SettingsError, redact, warn_not_enabled

_log = logging.getLogger("ng_otel")
_lock = threading.Lock()
_installed: FailureRecorder | None = None
_owned: list[Any] = []  # providers enable() created, flushed and shut down by shutdown()
_span_exporters: list[LossCountingSpanExporter] = []  # what those providers' span exporters reported
_deferred: list[Callable[[], bool]] = []  # provider installs waiting for the program's own set-up
_shutting_down = threading.Event()  # shutdown() is flushing
_terminate_after_shutdown = threading.Event()  # a SIGTERM arrived meanwhile

# OTEL_* variables a configuration error may come from, never quoted: they can hold secrets.
_SECRET_VARIABLE_PARTS = ("HEADERS", "KEY", "CERTIFICATE", "PASSWORD", "TOKEN")


def enable(
    service_name: str | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    logger_provider: LoggerProvider | None = None,
    enabled: bool | None = None,
    signals: str | frozenset[str] | set[str] | None = None,
    max_kinds: int | None = None,
    link_index_size: int | None = None,
    default_service_name: str | None = None,
    defer_providers: bool = False,
) -> FailureRecorder | None:
    """Turn ng_otel on for this process; idempotent (a second call returns the first recorder).

    ``service_name`` names the service whatever the environment says; ``default_service_name``
    only where neither ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` names one.
    ``defer_providers``: the program installs its own providers when it starts (NeMo Gym's
    telemetry does); ``settle_providers()`` then installs ng_otel's for every signal it did not.

    The settings arguments win over the ``NG_OTEL_*`` variables (``docs/configuration.md``).
    A misspelt or ill-typed argument is the caller's bug and raises here (``TypeError``,
    ``SettingsError``); a bad variable, or ``OTEL_*`` configuration the SDK rejects, leaves
    ng_otel off with one WARNING naming the variable and its value, and nothing installed.
    Returns the recorder, or ``None`` when off. Never raises for anything else.
    """
    arguments: dict[str, Any] = {
        "enabled": enabled,
        "signals": signals,
        "max_kinds": max_kinds,
        "link_index_size": link_index_size,
    }
    Settings.resolve(**arguments, environ={})  # the arguments alone: their errors are the caller's
    resource = _Resource(service_name, default_service_name)
    return _enable(resource, arguments, tracer_provider, meter_provider, logger_provider, defer_providers)


@guarded
def _enable(
    resource: _Resource,
    arguments: dict[str, Any],
    tracer_provider: TracerProvider | None,
    meter_provider: MeterProvider | None,
    logger_provider: LoggerProvider | None,
    defer_providers: bool,
) -> FailureRecorder | None:
    global _installed
    with _lock:
        if _installed is not None:
            return _installed
        try:
            settings = Settings.resolve(**arguments)
        except SettingsError as error:
            _stay_off(str(error))
            return None
        if not settings.enabled:
            install_recorder(None, enabled=False)
            return None
        wants_logs = "logs" in settings.signals
        limits_problem = span_limits_problem() if "spans" in settings.signals else None
        if limits_problem is not None:
            _stay_off(limits_problem)
            return None
        if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            pass  # the no-op API: nothing to build
        elif defer_providers and not any((tracer_provider, meter_provider, logger_provider)):
            # The program's set-up runs when it starts, after this; whether it installed any
            # providers is known only then (nemo-lens 0.1.0 installs none): settle_providers().
            _log.info("ng_otel: the program installs its own providers; ng_otel records through them")
            _deferred.append(lambda: _install_own(resource, settings, None, None, None))
        elif not _install_own(resource, settings, tracer_provider, meter_provider, logger_provider):
            return None
        tracer_provider = tracer_provider or trace.get_tracer_provider()
        meter_provider = meter_provider or metrics.get_meter_provider()
        logger_provider = logger_provider or get_logger_provider()
        recorder = FailureRecorder(
            tracer_provider.get_tracer(names.INSTRUMENTATION_SCOPE, __version__),
            meter_provider.get_meter(names.INSTRUMENTATION_SCOPE, __version__),
            logger_provider.get_logger(names.INSTRUMENTATION_SCOPE, __version__) if wants_logs else None,
            settings,
        )
        install_recorder(recorder)
        _installed = recorder
        return recorder


def _install_own(
    resource: _Resource,
    settings: Settings,
    tracer_provider: TracerProvider | None,
    meter_provider: MeterProvider | None,
    logger_provider: LoggerProvider | None,
) -> bool:
    """Build and install every provider not given and not installed yet; False (ng_otel
    off, one WARNING) when the SDK or an exporter rejects the ``OTEL_*`` configuration."""
    try:
        built = _build(resource.make(), "logs" in settings.signals, tracer_provider, meter_provider, logger_provider)
    except Exception as error:
        _stay_off(redact(f"{type(error).__name__}: {error}") + f" ({_otel_variables()})")
        return False
    _install(*built)
    if settings.sigterm_flush:
        _flush_on_sigterm()
    _quiet_repeated_sdk_warnings()
    return True


@guarded
def settle_providers() -> None:
    """Where ``enable()`` left the providers to the program (``defer_providers``): install
    ng_otel's own for every signal its set-up did not provide (a no-op once settled, or when
    nothing waits). The recorder already records through the global providers, whatever
    they are."""
    if not _deferred:
        return
    with _lock:
        pending, _deferred[:] = list(_deferred), []
        if isinstance(trace.get_tracer_provider(), ProxyTracerProvider):
            _log.info("ng_otel: the program installed no providers; ng_otel installs its own")
        for install_own in pending:
            install_own()


# (SpanLimits attribute, the variables it reads, the least ng_otel needs, what less would lose)
SPAN_LIMITS_NEEDED: Final = (
    ("max_events", ("OTEL_SPAN_EVENT_COUNT_LIMIT",), 1, "every ng.failure event would be dropped"),
    ("max_links", ("OTEL_SPAN_LINK_COUNT_LIMIT",), 1, "every cause link would be dropped"),
    (
        "max_event_attributes",
        ("OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",),
        len(names.EVENT_ATTRIBUTES) + 1,
        "attributes of an ng.failure event would be dropped",
    ),
    (
        "max_link_attributes",
        ("OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",),
        names.LINK_ATTRIBUTES_COUNT,
        "attributes of a cause link would be dropped",
    ),
    (
        "max_attribute_length",
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",),
        MAX_ID_CHARS,
        "event ids and kinds would be cut, and no longer match the reports and saved rows",
    ),
    (
        "max_span_attribute_length",
        ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"),
        MAX_KIND_CHARS,
        "a span's error.type (its failure's kind) would be cut",
    ),
)


def span_limits_problem() -> str | None:
    """Why the SDK's span limits from the ``OTEL_*`` variables would cut or drop what ng_otel
    exports (naming the variable), or ``None``. Nothing can work around a limit below what an
    id or an event needs, so ``enable()`` refuses it instead of losing failures silently."""
    from opentelemetry.sdk.trace import SpanLimits

    try:
        limits = SpanLimits()
    except ValueError:
        return None  # a malformed limit: the SDK rejects it when the provider is built, and says so
    for attribute, variables, least, loss in SPAN_LIMITS_NEEDED:
        value = getattr(limits, attribute)
        if value is not None and value < least:
            variable = next((name for name in variables if os.environ.get(name, "").strip()), variables[0])
            return f"{variable}={value}: {loss} (ng_otel needs at least {least})"
    return None


def ray_processes_wanted() -> bool:
    try:
        return Settings.resolve().ray_processes
    except SettingsError:
        return False  # enable() names the bad variable


def _stay_off(reason: str) -> None:
    warn_not_enabled(reason)
    install_recorder(None, enabled=False)


def _otel_variables() -> str:
    """The OTEL_* variables set here, for an error message (secrets never quoted)."""
    shown = [
        f"{name}=<set>" if any(part in name for part in _SECRET_VARIABLE_PARTS) else f"{name}={redact(value)[:60]!r}"
        for name, value in sorted(os.environ.items())
        if name.startswith("OTEL_")
    ]
    return ", ".join(shown) or "no OTEL_* variable is set"


@dataclass(frozen=True)
class _Resource:
    """``service_name``, else the standard ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES``,
    else ``default_service_name``."""

    service_name: str | None
    default_service_name: str | None

    def make(self) -> Any:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource

        resource = Resource.create({SERVICE_NAME: self.service_name} if self.service_name else {})
        fallback = self.default_service_name
        if fallback and str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: fallback}))
        return resource


# -- building the pipelines ------------------------------------------------------------------

Built = tuple[Any, Any, Any, list[Any]]
"""(tracer provider, meter provider, logger provider or None, the ones built here)."""


def _build(
    resource: Any,
    wants_logs: bool,
    tracer_provider: TracerProvider | None,
    meter_provider: MeterProvider | None,
    logger_provider: LoggerProvider | None,
) -> Built:
    """Every provider not given and not installed already, built but not yet installed; on
    any error, what was built is shut down again and the error raised."""
    built: list[Any] = []
    pushed: list[Any] = []  # the push metric exporters built: a rollback shuts them first
    try:
        # Metrics first: the span and log pipelines report what they drop through it.
        if meter_provider is None and isinstance(metrics.get_meter_provider(), ProxyMeterProvider):
            meter_provider = _meter_provider(resource, pushed)
            built.append(meter_provider)
        meter_provider = meter_provider or metrics.get_meter_provider()
        if tracer_provider is None and isinstance(trace.get_tracer_provider(), ProxyTracerProvider):
            tracer_provider = _tracer_provider(resource, meter_provider)
            built.append(tracer_provider)
        if wants_logs and logger_provider is None and isinstance(get_logger_provider(), ProxyLoggerProvider):
            logger_provider = _logger_provider(resource, meter_provider)
            built.append(logger_provider)
    except BaseException:
        _roll_back(built, pushed)
        raise
    return tracer_provider, meter_provider, logger_provider, built


def _roll_back(built: list[Any], pushed: list[Any]) -> None:
    """Shut down what a rejected configuration built, exporting nothing: a metric reader
    exports once more as it shuts down, which would try the endpoint (and wait out its
    timeout) for a pipeline that never ran. With its exporter shut first, that export is
    refused at once; the SDK's warning about it is no news and is not shown."""
    sdk_log = logging.getLogger("opentelemetry")
    level = sdk_log.level
    sdk_log.setLevel(logging.ERROR)
    try:
        for exporter in pushed:
            exporter.shutdown()
        for provider in built:
            provider.shutdown()
    finally:
        sdk_log.setLevel(level)


def _install(tracer_provider: Any, meter_provider: Any, logger_provider: Any, built: list[Any]) -> tuple[Any, Any, Any]:
    for provider in built:
        if provider is meter_provider:
            metrics.set_meter_provider(provider)
        elif provider is tracer_provider:
            trace.set_tracer_provider(provider)
        else:
            set_logger_provider(provider)
        _owned.append(provider)
    return tracer_provider, meter_provider, logger_provider


def exporter_classes(signal_name: str) -> list[type]:
    """The exporter classes ``OTEL_<SIGNAL>_EXPORTER`` names (default ``otlp``; a comma list;
    ``none`` for none), resolved through the SDK's own entry points and OTLP protocol rules."""
    raw = os.environ.get(f"OTEL_{signal_name.upper()}_EXPORTER", "").strip() or "otlp"
    chosen = [name.strip() for name in raw.split(",") if name.strip() and name.strip().lower() != "none"]
    return exporter_classes_named(chosen, signal_name)


def _usable_exporter_classes(signal_name: str) -> list[type]:
    """``exporter_classes``, refusing (``ValueError``) what could not deliver anything."""
    classes = exporter_classes(signal_name)
    for cls in classes:
        problem = grpc_credentials_problem(signal_name, cls)
        if problem is not None:
            raise ValueError(problem)
    return classes


def otlp_endpoint(signal_name: str) -> tuple[str, str]:
    """(variable, value) of the OTLP endpoint a signal's exporter reads, the signal's own
    variable first; ``("", "")`` when neither is set (the exporter's default)."""
    for variable in (f"OTEL_EXPORTER_OTLP_{signal_name.upper()}_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        value = os.environ.get(variable, "").strip()
        if value:
            return variable, value
    return "", ""


def grpc_credentials_problem(signal_name: str, exporter_class: type) -> str | None:
    """A gRPC exporter cannot use credentials in its endpoint's URL: the channel fails to
    resolve the address on every export, and the SDK's errors print the URL, secret and all."""
    if ".grpc." not in exporter_class.__module__:
        return None
    variable, value = otlp_endpoint(signal_name)
    parts = urlsplit(value if "://" in value else f"http://{value}")
    if parts.username is None and parts.password is None:
        return None
    return (
        f"{variable}={redact(value)}: the gRPC exporter cannot use credentials in the URL (every export would "
        "fail and print them); put them in OTEL_EXPORTER_OTLP_HEADERS"
    )


def _construct(exporter_class: type, meter_provider: MeterProvider) -> Any:
    # OTLP exporters report what they fail to send through the meter provider they are given.
    if "meter_provider" in inspect.signature(exporter_class).parameters:
        return exporter_class(meter_provider=meter_provider)
    return exporter_class()


def _meter_provider(resource: Any, pushed: list[Any]) -> MeterProvider:
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader

    readers: list[MetricReader] = []
    for cls in _usable_exporter_classes("metrics"):
        # A pull exporter (Prometheus) is a reader itself; a push exporter is read periodically.
        with processor_self_metrics():
            if issubclass(cls, MetricReader):
                readers.append(cls())
            else:
                pushed.append(cls())
                readers.append(PeriodicExportingMetricReader(pushed[-1]))
    return SdkMeterProvider(resource=resource, metric_readers=readers)


def _tracer_provider(resource: Any, meter_provider: MeterProvider) -> TracerProvider:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = SdkTracerProvider(resource=resource)
    classes = _usable_exporter_classes("traces")
    if classes:
        lost = meter_provider.get_meter(names.INSTRUMENTATION_SCOPE, __version__).create_counter(
            names.UNEXPORTED_METRIC, unit=names.UNEXPORTED_UNIT, description=names.UNEXPORTED_DESCRIPTION
        )
    for cls in classes:
        with processor_self_metrics():
            exporter = LossCountingSpanExporter(_construct(cls, meter_provider), lost)
            # Bounded queue (OTEL_BSP_MAX_QUEUE_SIZE); what it drops is counted in
            # otel.sdk.processor.span.processed{error.type="queue_full"}.
            processor = BatchSpanProcessor(exporter, meter_provider=meter_provider)
        provider.add_span_processor(processor)
        _span_exporters.append(exporter)
    return provider


def _logger_provider(resource: Any, meter_provider: MeterProvider) -> LoggerProvider:
    from opentelemetry.sdk._logs import LoggerProvider as SdkLoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    provider = SdkLoggerProvider(resource=resource)
    for cls in _usable_exporter_classes("logs"):
        with processor_self_metrics():
            processor = BatchLogRecordProcessor(_construct(cls, meter_provider), meter_provider=meter_provider)
        provider.add_log_record_processor(processor)
    return provider


class RepeatLimit(logging.Filter):
    """Lets one WARNING through per ``interval`` seconds, ERRORs always. With the collector
    down, the SDK warns once per dropped span, on the request's own thread; a filter alone
    still pays for building each record (about 4 µs), so once a warning has passed, the
    logger's level is raised to ERROR for the interval and a repeat costs a level check.
    The drops are counted in ``otel.sdk.processor.span.processed{error.type="queue_full"}``
    meanwhile."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 60.0,
        schedule: Callable[[float, Callable[[], None]], object] | None = None,
    ) -> None:
        super().__init__()
        self.interval = interval
        self._schedule = schedule or _after  # tests pass their own clock
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
        self._schedule(self.interval, self._reopen)
        return True

    def _reopen(self) -> None:
        with self._lock:
            if self._logger.level == logging.ERROR:  # unless someone set another level meanwhile
                self._logger.setLevel(self._level)
            self._quiet = False


def _after(seconds: float, action: Callable[[], None]) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.daemon = True
    timer.start()
    return timer


def _quiet_repeated_sdk_warnings() -> None:
    logger = logging.getLogger(SDK_DROP_WARNINGS_LOGGER)
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
        # A second SIGTERM during the flush means "now": it meets the default action, not
        # this handler waiting on the shutdown the first one started.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _shutting_down.is_set():
            # shutdown() is flushing already, perhaps on the very thread this handler
            # interrupted (its lock is not re-entrant): it ends the process once it is done.
            _terminate_after_shutdown.set()
            return
        shutdown()
        signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, flush_then_terminate)


def span_exporters() -> tuple[LossCountingSpanExporter, ...]:
    """The span exporters ``enable()`` built, each with the ``ng.failure`` events it reported
    exported and failed (none when the application's providers were reused)."""
    return tuple(_span_exporters)


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
    _shutting_down.set()
    try:
        with _lock:
            for provider in _owned:
                provider.shutdown()
            _owned.clear()
            _installed = None
            install_recorder(None)
    finally:
        _shutting_down.clear()
        if _terminate_after_shutdown.is_set():
            signal.raise_signal(signal.SIGTERM)  # a SIGTERM came during the flush: it ends the process now
