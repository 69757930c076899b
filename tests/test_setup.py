"""enable() in a fresh interpreter each time: providers are process-global in OpenTelemetry."""

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent(
    """
    import ng_otel
    from ng_otel import NgFailureEvent, record_failure
    from ng_otel.otel.providers import flush
    from opentelemetry import trace

    first = ng_otel.enable("agent-server")
    assert ng_otel.enable("other") is first
    try:
        try:
            raise NgFailureEvent("transport_timeout", "model timed out", boundary="model")
        except NgFailureEvent as err:
            raise NgFailureEvent("agent_run_error", "run failed", boundary="agent") from err
    except NgFailureEvent as top:
        with trace.get_tracer("app").start_as_current_span("POST /run"):
            record_failure(top)
    flush()
    print("enabled" if first is not None else "disabled")
    """
)


def run(env_extra, script=SCRIPT):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NG_OTEL_"))}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_enable_exports_over_otlp_from_the_standard_environment(otlp, protocol):
    endpoint = otlp.grpc_endpoint if protocol == "grpc" else otlp.http_endpoint
    done = run(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_METRIC_EXPORT_INTERVAL": "60000",
        }
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "enabled"
    assert otlp.wait_for(lambda: len(otlp.failure_events()) == 2)
    (span,) = otlp.spans()
    assert span["service"] == "agent-server" and span["name"] == "POST /run"
    assert [e["ng.failure.kind"] for e in otlp.failure_events()] == ["transport_timeout", "agent_run_error"]
    assert span["links"] == []  # the cause is on this same span: ng.failure.cause_id names it
    cause_id = otlp.failure_events()[1]["ng.failure.cause_id"]
    assert cause_id == otlp.failure_events()[0]["ng.failure.id"]
    assert otlp.wait_for(lambda: sum(p["value"] for p in otlp.metric_points("ng.failures")) == 2)


def test_disabled_by_environment_sends_nothing(otlp):
    done = run({"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.http_endpoint, "NG_OTEL_ENABLED": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "disabled"
    assert otlp.spans() == [] and otlp.metric_points("ng.failures") == []


def test_enable_reuses_providers_the_application_installed():
    script = (
        textwrap.dedent(
            """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        """
        )
        + SCRIPT
        + "print(sum(len(s.events) for s in exporter.get_finished_spans()))\n"
    )
    done = run({"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}, script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["enabled", "2"]
    assert "Overriding of current TracerProvider" not in done.stderr


def test_a_collector_that_is_down_never_breaks_the_program():
    done = run(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
            "OTEL_BSP_EXPORT_TIMEOUT": "1000",
        }
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "enabled"


@pytest.mark.parametrize(
    ("env", "warning"),
    [
        ({"NG_OTEL_SIGNALS": "traces"}, "NG_OTEL_SIGNALS='traces': expected spans, logs or spans,logs"),
        ({"NG_OTEL_MAX_KINDS": "abc"}, "NG_OTEL_MAX_KINDS='abc': expected a positive integer"),
        ({"NG_OTEL_LINK_INDEX_SIZE": "0"}, "NG_OTEL_LINK_INDEX_SIZE='0': expected a positive integer"),
        ({"NG_OTEL_ENABLED": "maybe"}, "NG_OTEL_ENABLED='maybe': expected 1/0, true/false, yes/no or on/off"),
        # The SDK rejects this inside its BatchSpanProcessor (batch 512 > queue 256): nothing is
        # installed, not even the meter provider built before it.
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "256"}, "OTEL_BSP_MAX_QUEUE_SIZE='256'"),
        ({"OTEL_TRACES_EXPORTER": "nosuch"}, "OTEL_TRACES_EXPORTER='nosuch'"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, "Unsupported OTLP protocol 'carrier-pigeon'"),
    ],
)
def test_a_bad_setting_leaves_everything_off_with_one_warning_naming_it(env, warning):
    script = SCRIPT + textwrap.dedent(
        """
        from opentelemetry import metrics
        print(type(trace.get_tracer_provider()).__name__, type(metrics.get_meter_provider()).__name__)
        """
    )
    done = run({"OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_HEADERS": "api-key=secret", **env}, script=script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["disabled", "ProxyTracerProvider", "_ProxyMeterProvider"]
    warnings = [line for line in done.stderr.splitlines() if "ng_otel" in line]
    assert len(warnings) == 1 and warnings[0].startswith("ng_otel: not enabled: ") and warning in warnings[0]
    assert "secret" not in done.stderr


@pytest.mark.parametrize(
    ("variable", "value", "loss"),
    [
        ("OTEL_SPAN_EVENT_COUNT_LIMIT", "0", "every ng.failure event would be dropped"),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "16", "event ids and kinds would be cut"),
        ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "20", "a span's error.type (its failure's kind) would be cut"),
        ("OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "5", "attributes of an ng.failure event would be dropped"),
        ("OTEL_SPAN_LINK_COUNT_LIMIT", "0", "every cause link would be dropped"),
        ("OTEL_LINK_ATTRIBUTE_COUNT_LIMIT", "1", "attributes of a cause link would be dropped"),
    ],
)
def test_span_limits_that_would_cut_or_drop_failures_are_refused_with_one_warning_naming_the_variable(
    variable, value, loss
):
    done = run({"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none", variable: value})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["disabled"]  # nothing recorded, nothing cut
    (warning,) = [line for line in done.stderr.splitlines() if "ng_otel" in line]
    assert f"not enabled: {variable}={value}: {loss}" in warning


def test_span_limits_that_keep_everything_ng_otel_exports_are_fine():
    env = {"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "128", "OTEL_SPAN_EVENT_COUNT_LIMIT": "1"}
    done = run({"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none", **env})
    assert done.returncode == 0 and '"name": "ng.failure"' in done.stdout, done.stderr


def test_a_configuration_rejected_after_the_metric_pipeline_was_built_rolls_back_without_exporting():
    # An unknown logs exporter fails once the metric and span pipelines exist (the span
    # processor's queue gauges are metric points by then); the reader used to export once more
    # while shutting down: against a collector that never answers, enable() waited out the
    # export timeout and printed "Failed to export" first.
    with socket.socket() as collector:
        collector.bind(("127.0.0.1", 0))
        collector.listen(8)
        env = {
            "NG_OTEL_SIGNALS": "spans,logs",
            "OTEL_LOGS_EXPORTER": "nosuch",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.getsockname()[1]}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "8",
        }
        started = time.monotonic()
        done = run(env, script="import ng_otel\nprint(ng_otel.enable('svc'))")
        elapsed = time.monotonic() - started
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr
    assert elapsed < 6, elapsed  # not the 8 s export timeout
    (warning,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert warning.startswith("ng_otel: not enabled: ") and "nosuch" in warning


def test_a_grpc_endpoint_with_credentials_is_refused_with_one_warning_never_quoting_them():
    done = run({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://user:s3cr3t@127.0.0.1:4317", "OTEL_METRICS_EXPORTER": "none"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["disabled"]
    (warning,) = [line for line in done.stderr.splitlines() if "ng_otel" in line]
    assert "the gRPC exporter cannot use credentials in the URL" in warning and "s3cr3t" not in done.stderr


def test_the_not_enabled_warning_never_quotes_the_credentials_of_an_endpoint():
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://user:s3cr3t@127.0.0.1:4317/?token=s3cr3t",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon",
    }
    done = run({"OTEL_METRICS_EXPORTER": "none", **env})
    assert done.returncode == 0, done.stderr
    (warning,) = [line for line in done.stderr.splitlines() if "ng_otel" in line]
    assert "OTEL_EXPORTER_OTLP_ENDPOINT='http://***@127.0.0.1:4317/?token=***'" in warning
    assert "s3cr3t" not in done.stderr


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ('ng_otel.enable("svc", max_kind=5)', "TypeError"),
        ('ng_otel.enable("svc", max_kinds=0)', "SettingsError: max_kinds='0': expected a positive integer"),
        ('ng_otel.enable("svc", enabled="yes")', "SettingsError: enabled='yes': expected True or False"),
        ('ng_otel.enable("svc", signals="traces")', "SettingsError: signals='traces'"),
    ],
)
def test_a_misspelt_or_ill_typed_argument_fails_loudly_in_the_callers_code(call, error):
    done = run({"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}, script=f"import ng_otel\n{call}\n")
    assert done.returncode == 1 and error in done.stderr


def test_every_exporter_of_a_comma_list_gets_the_spans(otlp):
    done = run(
        {
            "OTEL_TRACES_EXPORTER": "otlp,console",
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.grpc_endpoint,
            "OTEL_METRICS_EXPORTER": "none",
        }
    )
    assert done.returncode == 0, done.stderr
    assert '"name": "POST /run"' in done.stdout  # the console exporter
    assert otlp.wait_for(lambda: len(otlp.failure_events()) == 2)  # and the default OTLP protocol: gRPC


SELF_METRICS = textwrap.dedent(
    """
    import os, ng_otel
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    ng_otel.enable("app")
    with trace.get_tracer("an.instrumentation").start_as_current_span("GET /"):
        ng_otel.record_failure(ng_otel.NgFailureEvent("shutdown", "x", boundary="agent"))
    names = {m.name for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    print(
        "result",
        os.environ.get("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "unset"),
        "span-metrics" if "otel.sdk.span.started" in names else "no-span-metrics",
        "log-metrics" if "otel.sdk.log.created" in names else "no-log-metrics",
        "queue-metrics" if "otel.sdk.processor.span.queue.capacity" in names else "no-queue-metrics",
        flush=True,
    )
    """
)


@pytest.mark.parametrize(
    ("user_setting", "expected"),
    [
        # The SDK's per-span (and per-log-record) self-metrics cost ~20 us a span; enable()
        # turns the variable on only while it builds exporters, processors and readers,
        # whose drops it must count.
        (None, ["unset", "no-span-metrics", "no-log-metrics", "queue-metrics"]),
        # Self-metrics the user asked for are left on.
        ("true", ["true", "span-metrics", "log-metrics", "queue-metrics"]),
    ],
)
def test_enable_counts_pipeline_losses_without_taxing_every_span_of_the_process(user_setting, expected):
    env = {
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "none",
        "NG_OTEL_SIGNALS": "spans,logs",
        "OTEL_LOGS_EXPORTER": "console",
    }
    if user_setting is not None:
        env["OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED"] = user_setting
    done = run(env, SELF_METRICS)
    assert done.returncode == 0, done.stderr
    assert _result(done) == expected


def _result(done):
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("result ")]
    return line.split()[1:]


GYM_OWNED = textwrap.dedent(
    """
    import ng_otel
    from ng_otel import NgFailureEvent, record_failure
    from opentelemetry import metrics, trace
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    assert ng_otel.enable("agent-server") is not None  # as opentelemetry-instrument does, at start-up
    installed = type(trace.get_tracer_provider()).__name__, type(metrics.get_meter_provider()).__name__
    print("providers after enable:", *installed)

    # What Gym's telemetry (nemo-lens) does once the server starts: the process's providers.
    resource = Resource.create({"service.name": "gym-owned"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(), export_interval_millis=60000)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)

    with trace.get_tracer("gym").start_as_current_span("POST /verify"):
        record_failure(NgFailureEvent("judge_failed", "judge timed out", boundary="resources_server"))
    tracer_provider.shutdown()
    meter_provider.shutdown()
    """
)


@pytest.mark.parametrize("switch", ["NEMO_GYM_OTEL_ENABLED", "NEMO_LENS_ENABLED"])
def test_where_gym_telemetry_owns_the_providers_ng_otel_records_through_them_and_installs_none(otlp, tmp_path, switch):
    # nemo-lens is not on the public registry: an importable stand-in makes Gym's switch live.
    (tmp_path / "nemo" / "lens").mkdir(parents=True)
    (tmp_path / "nemo" / "lens" / "__init__.py").write_text("")
    done = run(
        {
            switch: "1",
            "PYTHONPATH": str(tmp_path),
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.grpc_endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
        },
        script=GYM_OWNED,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "providers after enable: ProxyTracerProvider _ProxyMeterProvider"
    assert otlp.wait_for(lambda: len(otlp.failure_events()) == 1)
    (span,) = otlp.spans()
    assert span["service"] == "gym-owned" and span["name"] == "POST /verify"
    assert otlp.wait_for(lambda: sum(p["value"] for p in otlp.metric_points("ng.failures")) == 1)
    assert "Overriding of current" not in done.stderr  # nobody tried to replace Gym's providers


GYM_INSTALLS_NONE = textwrap.dedent(
    """
    import ng_otel
    from ng_otel import NgFailureEvent, record_failure
    from ng_otel.otel.providers import settle_providers
    from opentelemetry import trace

    assert ng_otel.enable("agent-server") is not None  # as opentelemetry-instrument does, at start-up
    # Gym's init_telemetry runs now and, with nemo-lens 0.1.0, installs nothing; then the app
    # builds its middleware stack, where the instrumentor settles the providers.
    settle_providers()
    print("providers after the server started:", type(trace.get_tracer_provider()).__name__)
    with trace.get_tracer("gym").start_as_current_span("POST /verify"):
        record_failure(NgFailureEvent("judge_failed", "judge timed out", boundary="resources_server"))
    from ng_otel.otel import shutdown
    shutdown()
    """
)


def test_where_gym_telemetry_is_on_but_installs_no_providers_ng_otel_installs_its_own_once_the_server_starts(
    otlp, tmp_path
):
    # nemo-lens 0.1.0, the only one on the index, fails inside Gym's init_telemetry: switched
    # on, importable, and no provider.
    (tmp_path / "nemo" / "lens").mkdir(parents=True)
    (tmp_path / "nemo" / "lens" / "__init__.py").write_text("")
    env = {"NEMO_GYM_OTEL_ENABLED": "1", "PYTHONPATH": str(tmp_path), "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.grpc_endpoint}
    done = run({**env, "OTEL_EXPORTER_OTLP_INSECURE": "true"}, script=GYM_INSTALLS_NONE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "providers after the server started: TracerProvider"
    assert otlp.wait_for(lambda: len(otlp.failure_events()) == 1)
    (span,) = otlp.spans()
    assert span["service"] == "agent-server" and span["name"] == "POST /verify"


def test_gym_telemetry_switched_on_without_nemo_lens_leaves_ng_otel_installing_its_own():
    # Gym's telemetry cannot run without nemo-lens, so nobody else would install providers.
    done = run({"NEMO_GYM_OTEL_ENABLED": "1", "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"})
    assert done.returncode == 0, done.stderr
    assert '"name": "ng.failure"' in done.stdout


@pytest.mark.parametrize(
    ("env", "service"),
    [
        ({"NEMO_GYM_CONFIG_PATH": "math_resources"}, "math_resources"),
        ({"NEMO_GYM_CONFIG_PATH": "math_resources", "OTEL_SERVICE_NAME": "chosen"}, "chosen"),
        ({"NEMO_GYM_CONFIG_PATH": "math_resources", "OTEL_RESOURCE_ATTRIBUTES": "service.name=attr"}, "attr"),
    ],
)
def test_a_gym_server_is_named_after_its_gym_config_unless_the_standard_variables_say(env, service):
    script = "import ng_otel; from opentelemetry import trace\n"
    script += "ng_otel.enable(); print(trace.get_tracer_provider().resource.attributes['service.name'])"
    done = run({**env, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}, script=script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == service
