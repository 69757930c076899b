"""``ng-otel doctor``: what ng_otel would do here. ``main(argv)`` in this process, with the
environment each test gives it; one process of its own, where what it finds depends on the
interpreter's own path."""

import pytest


def test_a_working_setup_is_ok_and_says_where_each_setting_came_from(cli, otlp):
    done = cli(
        "doctor",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.grpc_endpoint, "NG_OTEL_MAX_KINDS": "7", "OTEL_SERVICE_NAME": "svc"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    rows = " ".join(out.split())  # the table's columns are as wide as its longest setting
    assert "NG_OTEL_MAX_KINDS │ 7 │ environment" in rows and "NG_OTEL_ENABLED │ True │ default" in rows
    assert "service.name: svc" in out and otlp.grpc_endpoint in out
    assert out.count("│ yes ") == 2  # the trace and metric endpoints answer
    assert "opentelemetry-instrument loads ng_otel: yes" in out and "verdict: ok" in out


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, "nothing answers at http://127.0.0.1:9"),
        ({"NG_OTEL_MAX_KINDS": "abc"}, "NG_OTEL_MAX_KINDS='abc': expected a positive integer"),
        ({"NG_OTEL_ENABLED": "0"}, "ng_otel is switched off"),
        ({"OTEL_TRACES_EXPORTER": "nosuch", "OTEL_METRICS_EXPORTER": "none"}, "Requested component 'nosuch' not found"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}, "would be recorded nowhere"),
    ],
)
def test_telemetry_that_would_go_nowhere_exits_non_zero_and_says_why(cli, env, problem):
    done = cli("doctor", env=env)
    assert done.returncode == 1, done.stdout
    assert problem in " ".join(done.stdout.split())  # rich wraps long lines
    assert "verdict: failures would be recorded nowhere" in done.stdout


def test_a_console_exporter_delivers_even_when_the_otlp_endpoint_is_down(cli):
    env = {"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    done = cli("doctor", env=env)
    assert done.returncode == 0 and "verdict: ok, with the problems above" in done.stdout


@pytest.mark.e2e
def test_gym_telemetry_switched_on_is_judged_by_the_exporters_that_would_be_used(ng_otel_process, tmp_path):
    # nemo-lens 0.1.0 installs no provider inside Gym's init_telemetry; ng_otel then installs its
    # own, so the OTEL_* exporters decide, and one that reaches nothing is a failure, not "ok".
    (tmp_path / "nemo" / "lens").mkdir(parents=True)
    (tmp_path / "nemo" / "lens" / "__init__.py").write_text("")
    env = {
        "NEMO_GYM_OTEL_ENABLED": "1",
        "PYTHONPATH": str(tmp_path),
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
    }
    done = ng_otel_process("doctor", env=env)
    out = " ".join(done.stdout.split())
    assert done.returncode == 1, out
    assert "NeMo Gym's telemetry (nemo-lens), where it installs them" in out
    assert "nothing answers at http://127.0.0.1:9" in out and "verdict: failures would be recorded nowhere" in out


def test_a_gym_server_is_named_after_its_gym_config_name(cli, otlp):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.grpc_endpoint, "NEMO_GYM_CONFIG_PATH": "policy_model"}
    done = cli("doctor", env=env)
    assert done.returncode == 0 and "service.name: policy_model" in done.stdout, done.stdout


SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    "endpoint", [f"http://user:{SECRET}@127.0.0.1:9", f"http://127.0.0.1:9/v1/traces?token={SECRET}&tenant=a"]
)
def test_credentials_in_an_endpoint_are_never_printed(cli, endpoint):
    done = cli("doctor", env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert done.returncode == 1  # nothing answers there
    assert SECRET not in done.stdout + done.stderr
    assert "127.0.0.1:9" in done.stdout and "***" in done.stdout  # the endpoint is still shown, redacted


def test_credentials_in_a_grpc_endpoint_are_a_failure_the_grpc_exporter_cannot_use(cli, otlp):
    # The gRPC channel cannot resolve user:secret@host: every export fails, printing the URL.
    port = otlp.grpc_endpoint.rsplit(":", 1)[1]
    done = cli("doctor", env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://user:{SECRET}@127.0.0.1:{port}"})
    out = " ".join(done.stdout.split())
    assert done.returncode == 1 and "verdict: failures would be recorded nowhere" in out
    assert "the gRPC exporter cannot use credentials in the URL" in out and SECRET not in done.stdout + done.stderr


def test_counts_without_spans_are_a_problem_but_not_nowhere(cli, otlp):
    done = cli("doctor", env={"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.grpc_endpoint, "OTEL_TRACES_EXPORTER": "none"})
    out = " ".join(done.stdout.split())
    assert done.returncode == 0 and "verdict: ok, with the problems above" in out
    assert "no trace exporter delivers: only counts arrive" in out
