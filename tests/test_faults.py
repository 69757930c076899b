"""The collector in trouble: down, refusing, slow, flapping, restarted, and the process
ending with events still queued. Replies never change; what is lost is counted."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.request

import pytest

from ng_otel.cli.demo_stack.stack import gym_stack, run_collection
from ng_otel.cli.receiver import OtlpReceiver
from tests.conftest import unused_port, wait_until

pytestmark = pytest.mark.e2e
SCENARIOS = ["model_timeout", "retry_recovered", "judge_failed", "ok"]
EXPECTED = {"model_timeout": 500, "retry_recovered": 200, "judge_failed": 500, "ok": 200}
FAST = {
    "OTEL_BSP_SCHEDULE_DELAY": "100",
    "OTEL_METRIC_EXPORT_INTERVAL": "500",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",  # the receiver's HTTP endpoint (gRPC is the default)
}


def rollouts(agent_url, tmp_path, env, repeat=3):
    return run_collection(agent_url, tmp_path / "rows.jsonl", env, scenarios=SCENARIOS, repeat=repeat, concurrency=4)


def assert_replies_unaffected(rows):
    assert [(r["scenario"], r["status"]) for r in rows] == [(s, EXPECTED[s]) for s in SCENARIOS * 3]
    assert all(r["report_header"] for r in rows if r["scenario"] != "ok")


def self_metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def failed_exports(text):
    """Failure events whose export failed, as ng.failures.unexported counts them."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("ng_failures_unexported_total{")
    )


@pytest.mark.parametrize("fault", ["down", "refusing", "slow"])
def test_replies_are_unaffected_and_losses_are_counted(fault, tmp_path, refused_port):
    receiver = OtlpReceiver().start()
    endpoint = receiver.http_endpoint
    if fault == "down":
        receiver.stop()
        endpoint = f"http://127.0.0.1:{refused_port}"
    receiver.refuse = fault == "refusing"
    receiver.delay = 10.0 if fault == "slow" else 0.0
    metrics_port = unused_port()
    env = {**FAST, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_METRICS_EXPORTER": "none"}
    agent_env = {
        "agent": {
            "OTEL_METRICS_EXPORTER": "prometheus",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": str(metrics_port),
        }
    }
    try:
        with gym_stack(env=env, log_dir=tmp_path, server_env=agent_env) as urls:
            assert_replies_unaffected(rollouts(urls.agent, tmp_path, {**env, "OTEL_TRACES_EXPORTER": "none"}))
            if fault != "slow":  # a slow collector still accepts, it only answers late
                wait_until(
                    lambda: failed_exports(self_metrics(metrics_port)) > 0, 20, "ng.failures.unexported to count a loss"
                )
                assert failed_exports(self_metrics(metrics_port)) > 0, "a loss that no metric shows"
    finally:
        if fault != "down":
            receiver.stop()


def test_a_flapping_collector_and_a_restart_mid_run_lose_only_what_they_refused(tmp_path):
    receiver = OtlpReceiver().start()
    ports = receiver.grpc_port, receiver.http_port
    env = {**FAST, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, "OTEL_METRICS_EXPORTER": "none"}
    stop = threading.Event()

    def flap():
        while not stop.wait(0.3):
            receiver.refuse = not receiver.refuse

    flapper = threading.Thread(target=flap, daemon=True)
    try:
        with gym_stack(env=env, log_dir=tmp_path) as urls:
            flapper.start()
            assert_replies_unaffected(rollouts(urls.agent, tmp_path, {**env, "OTEL_TRACES_EXPORTER": "none"}))
            stop.set()
            flapper.join()
            receiver.stop()  # the collector restarts on the same ports, as soon as they are free

            def restarted():
                try:
                    return OtlpReceiver().start(*ports)
                except OSError:
                    return None

            receiver = wait_until(restarted, 10, f"the collector's ports {ports} to be free again")
            rows = rollouts(urls.agent, tmp_path, {**env, "OTEL_TRACES_EXPORTER": "none"})
            assert_replies_unaffected(rows)
        after = {eid for row in rows for eid in row.get("_ng_failure_events", {})}
        assert receiver.wait_for(lambda: after <= {e["ng.failure.id"] for e in receiver.failure_events()}, 20)
    finally:
        stop.set()
        receiver.stop()


QUEUED = textwrap.dedent(
    """
    import signal, ng_otel
    from opentelemetry import trace
    ng_otel.enable("queued")
    tracer = trace.get_tracer("t")
    for i in range(20):
        with tracer.start_as_current_span(f"request {i}"):
            ng_otel.record_failure(ng_otel.NgFailureEvent("shutdown", f"draining {i}", boundary="agent"))
    print("ready", flush=True)
    signal.pause()  # until the test's SIGTERM
    """
)


def test_sigterm_with_events_still_queued_flushes_them_first(otlp):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.http_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
        "OTEL_METRIC_EXPORT_INTERVAL": "600000",
    }
    process = subprocess.Popen([sys.executable, "-c", QUEUED], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        assert otlp.failure_events() == []  # still queued: the batch delay is ten minutes
        process.send_signal(signal.SIGTERM)
        # It still ends as SIGTERM says. The bound covers the flush's two exports (spans, then
        # metrics, 10 s each at most by default) on a machine busy with the suite's other worker.
        assert process.wait(timeout=60) == -signal.SIGTERM
    finally:
        if process.poll() is None:  # it waits for a signal: never leave it waiting
            process.kill()
            process.wait()
    assert len(otlp.failure_events()) == 20
    assert sum(p["value"] for p in otlp.metric_points("ng.failures")) == 20


MEMORY = textwrap.dedent(
    """
    import resource, ng_otel
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    reader = InMemoryMetricReader()
    ng_otel.enable("memory", meter_provider=MeterProvider(metric_readers=[reader]))
    tracer = trace.get_tracer("t")
    def burst(count):
        for i in range(count):
            with tracer.start_as_current_span("request"):
                ng_otel.record_failure(ng_otel.NgFailureEvent("shutdown", "x" * 1500, boundary="agent"))
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    early = burst(5_000)
    late = burst(25_000)
    dropped = sum(p.value for m in reader.get_metrics_data().resource_metrics[0].scope_metrics for metric in m.metrics
                  if metric.name == "otel.sdk.processor.span.processed" for p in metric.data.data_points
                  if p.attributes.get("error.type") == "queue_full")
    print(early, late, int(dropped))
    """
)


@pytest.mark.alone  # how many spans the queue drops depends on how much CPU its exporter gets
def test_a_dead_collector_keeps_memory_bounded_and_counts_what_the_queue_dropped(refused_port):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{refused_port}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        "OTEL_BSP_MAX_QUEUE_SIZE": "512",
    }
    done = subprocess.run([sys.executable, "-c", MEMORY], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    early, late, dropped = map(int, done.stdout.split())
    assert late - early < 40, f"peak RSS grew from {early} MiB to {late} MiB"
    assert dropped > 20_000  # 30,000 spans into a 512-span queue that never drains: counted, not silent
