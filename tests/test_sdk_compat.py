"""The OpenTelemetry SDK's private parts ng_otel reaches (``ng_otel/otel/_sdk_compat.py``):
each test fails naming the part when an SDK release moves it."""

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

from ng_otel.otel import _sdk_compat


@pytest.mark.parametrize("module", _sdk_compat.PROCESSOR_MODULES)
def test_the_batch_processor_modules_read_the_self_metrics_switch_through_their_own_name(module):
    found = importlib.import_module(module)
    assert callable(getattr(found, _sdk_compat.SWITCH_READER, None)), (
        f"{module} no longer imports {_sdk_compat.SWITCH_READER}: the SDK changed how its processors "
        "read OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED; ng_otel/otel/_sdk_compat.py must follow"
    )


def metric_names(reader):
    data = reader.get_metrics_data()
    return {m.name for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics for m in sm.metrics}


def test_a_processor_built_inside_counts_its_queue_and_one_built_after_does_not():
    assert "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED" not in os.environ
    inside, after = InMemoryMetricReader(), InMemoryMetricReader()
    with _sdk_compat.processor_self_metrics():
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
