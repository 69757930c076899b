"""The private parts of other libraries ng_otel reaches (``ng_otel/_compat.py``): each test
fails naming the part when a release moves it."""

import gc
import importlib
import os
import subprocess
import sys
import textwrap

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ng_otel import _compat


@pytest.mark.parametrize("module", _compat.PROCESSOR_MODULES)
def test_the_batch_processor_modules_read_the_self_metrics_switch_through_their_own_name(module):
    found = importlib.import_module(module)
    assert callable(getattr(found, _compat.SWITCH_READER, None)), (
        f"{module} no longer imports {_compat.SWITCH_READER}: the SDK changed how its processors "
        "read OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED; ng_otel/otel/_compat.py must follow"
    )


def metric_names(reader):
    data = reader.get_metrics_data()
    return {m.name for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics for m in sm.metrics}


def test_a_processor_built_inside_counts_its_queue_and_one_built_after_does_not():
    assert "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED" not in os.environ
    inside, after = InMemoryMetricReader(), InMemoryMetricReader()
    with _compat.processor_self_metrics():
        counted = BatchSpanProcessor(InMemorySpanExporter(), meter_provider=MeterProvider(metric_readers=[inside]))
    plain = BatchSpanProcessor(InMemorySpanExporter(), meter_provider=MeterProvider(metric_readers=[after]))
    try:
        assert "otel.sdk.processor.span.queue.capacity" in metric_names(inside)
        assert "otel.sdk.processor.span.queue.capacity" not in metric_names(after)
    finally:
        counted.shutdown()
        plain.shutdown()


def test_enable_never_writes_os_environ():
    # os.environ's writes raise the os.putenv / os.unsetenv audit events; another thread
    # reading the environment while enable() builds its pipelines sees nothing change.
    script = textwrap.dedent(
        """
        import sys
        written = []
        sys.addaudithook(lambda event, args: written.append(event) if event in ("os.putenv", "os.unsetenv") else None)
        import ng_otel
        assert ng_otel.enable("svc") is not None
        print("environment writes:", written)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NG_OTEL_"))}
    env |= {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console", "NG_OTEL_SIGTERM_FLUSH": "0"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert "environment writes: []" in done.stdout, done.stdout + done.stderr


def test_the_apis_providers_before_any_is_installed_are_the_proxies_named_here():
    # In a fresh interpreter: "nothing installed yet" is how enable() knows what to build.
    script = textwrap.dedent(
        """
        from opentelemetry import _logs, metrics
        from ng_otel import _compat
        print(type(metrics.get_meter_provider()) is _compat.ProxyMeterProvider,
              type(_logs.get_logger_provider()) is _compat.ProxyLoggerProvider)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "True"], (
        "the OpenTelemetry API no longer hands out opentelemetry.metrics._internal._ProxyMeterProvider or "
        f"opentelemetry._logs._internal.ProxyLoggerProvider before a provider is installed:\n{done.stderr}"
    )


@pytest.mark.parametrize(("name", "signal_name", "module"), [("otlp", "traces", "otlp"), ("console", "traces", "sdk")])
def test_exporter_names_resolve_through_the_sdks_entry_points(name, signal_name, module):
    (found,) = _compat.exporter_classes_named([name], signal_name)
    assert module in found.__module__, found


def test_a_spans_room_is_its_limits_less_what_it_holds():
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    span = TracerProvider(span_limits=SpanLimits(max_events=3, max_links=2)).get_tracer("t").start_span("s")
    assert _compat.span_room(span) == (3, 2), "the SDK's span no longer keeps _limits, _events and _links"
    span.add_event("e")
    span.add_link(span.get_span_context())
    assert _compat.span_room(span) == (2, 1)
    span.end()


def test_a_span_context_is_the_tuple_named_here_and_comes_back_equal_from_its_numbers():
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState

    assert _compat.LAYOUT_HOLDS, "SpanContext is no longer (trace_id, span_id, is_remote, flags, state, is_valid)"
    context = SpanContext(7, 9, is_remote=True, trace_flags=TraceFlags(0x81))
    plain = _compat.plain_span_context(context)
    gc.collect()  # the collector stops tracking a tuple of numbers when it first meets it
    assert plain == (7, 9, 0x81, True) and not gc.is_tracked(plain)
    back = _compat.span_context_of(plain)
    assert back == context and back.trace_flags == 0x81 and back.is_valid and back.is_remote
    assert _compat._plain_by_fields(context) == plain and _compat._context_by_fields(plain) == context
    with_state = SpanContext(7, 9, is_remote=False, trace_state=TraceState([("vendor", "x")]))
    assert _compat.plain_span_context(with_state) is None
    assert _compat.plain_span_context(SpanContext(0, 0, is_remote=False)) is None


def test_starlettes_exception_middleware_keeps_the_handler_table_named_here():
    from fastapi import FastAPI
    from starlette.middleware.exceptions import ExceptionMiddleware

    app = FastAPI()

    @app.exception_handler(KeyError)
    async def handler(request, error):
        return None

    stack = app.build_middleware_stack()
    node, found = stack, None
    for _ in range(10):
        if isinstance(node, ExceptionMiddleware):
            found = _compat.exception_handlers_of(node)
            break
        node = getattr(node, "app", None)
    assert found is not None and KeyError in found, (
        f"starlette's ExceptionMiddleware no longer keeps {_compat.STARLETTE_HANDLERS}: "
        "ng_otel.integrations.asgi.install_raise_recorder must follow"
    )


def test_a_full_span_queue_warns_through_the_logger_named_here(caplog):
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    processor = BatchSpanProcessor(
        InMemorySpanExporter(), max_queue_size=1, max_export_batch_size=1, schedule_delay_millis=60_000
    )
    provider.add_span_processor(processor)
    with caplog.at_level("WARNING", logger=_compat.SDK_DROP_WARNINGS_LOGGER):
        for _ in range(5):
            provider.get_tracer("t").start_span("s").end()
    try:
        assert any(record.name == _compat.SDK_DROP_WARNINGS_LOGGER for record in caplog.records), (
            f"the SDK no longer warns of dropped spans through {_compat.SDK_DROP_WARNINGS_LOGGER}: "
            "ng_otel's RepeatLimit would no longer quiet it"
        )
    finally:
        provider.shutdown()
