"""The alerting path with the real Prometheus from Debian's packages: promtool proves every
rule, and a Prometheus server scraping the Gym stack fires the surge alert from real failures."""

import json
import os
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from ng_otel.cli.demo_stack.stack import gym_stack, run_collection
from ng_otel.otel import names
from tests.conftest import unused_port, wait_until

pytestmark = pytest.mark.e2e
RULES_DIR = Path(__file__).resolve().parents[1] / "collector-config" / "prometheus"


def binary(name):
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing: .ci/run installs Debian's prometheus package")
        pytest.skip(f"{name} is not installed (apt-get install -y prometheus)")
    return found


def rules_without_waits(folder: Path) -> Path:
    """The shipped rules written to ``folder``, every alert's ``for`` set to 0s, so a test that
    fires them from real failures need not wait minutes."""
    rules = yaml.safe_load((RULES_DIR / "rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = "0s"
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    return path


def test_promtool_accepts_the_rules():
    done = subprocess.run(
        [binary("promtool"), "check", "rules", "rules.yaml"], cwd=RULES_DIR, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_prove_each_alert_firing_and_not_firing():
    done = subprocess.run(
        [binary("promtool"), "test", "rules", "rules.test.yaml"], cwd=RULES_DIR, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tests = yaml.safe_load((RULES_DIR / "rules.test.yaml").read_text())["tests"]
    alerts = {
        rule["alert"]
        for group in yaml.safe_load((RULES_DIR / "rules.yaml").read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    checks = [check for test in tests for check in test.get("alert_rule_test", [])]
    for alert in alerts:
        outcomes = {bool(check["exp_alerts"]) for check in checks if check["alertname"] == alert}
        assert outcomes == {True, False}, f"{alert} needs a firing and a not-firing case"


def api(base, path, **params):
    url = f"{base}{path}" + ("?" + urllib.parse.urlencode(params, doseq=True) if params else "")
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())["data"]


def wait(predicate, what):
    """Prometheus scrapes and evaluates each second; an API not yet answering is "not yet"."""
    wait_until(predicate, 90, what, ignoring=(OSError,))


def listening_address(server, log):
    """Where the Prometheus started on port 0 listens, once its log says so."""

    def address():
        assert server.poll() is None, f"prometheus exited with {server.returncode}: {log.read_text()[-2000:]}"
        found = re.search(r'msg="Listening on" address=(\S+)', log.read_text())
        return found and found[1]

    return wait_until(address, 30, lambda: f"prometheus to say where it listens: {log.read_text()[-2000:]}")


def test_real_prometheus_fires_the_surge_alert_from_real_failures(tmp_path: Path):
    prometheus = binary("prometheus")
    metrics_ports = {name: unused_port() for name in ("model", "resources", "agent")}
    server_env = {
        name: {
            "OTEL_METRICS_EXPORTER": "prometheus",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
        }
        for name, port in metrics_ports.items()
    }
    quiet = {"OTEL_TRACES_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}

    rules = rules_without_waits(tmp_path)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "gym",
                "static_configs": [{"targets": [f"127.0.0.1:{port}" for port in metrics_ports.values()]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = tmp_path / "prometheus.log"
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            "--web.listen-address=127.0.0.1:0",  # it binds any free port and logs which
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    try:
        base = f"http://{listening_address(server, log)}"
        with gym_stack(env=quiet, log_dir=tmp_path, server_env=server_env) as urls:
            wait(
                lambda: len([t for t in api(base, "/api/v1/targets")["activeTargets"] if t["health"] == "up"]) == 3,
                "all three servers scraped",
            )

            def rollouts(count):
                run_collection(urls.agent, tmp_path / "rows.jsonl", quiet, scenarios=["model_timeout"], repeat=count)

            def counted(kind):
                result = api(base, "/api/v1/query", query=f'sum(ng_failures_total{{ng_failure_kind="{kind}"}})')
                return float(result["result"][0]["value"][1]) if result["result"] else 0.0

            # A counter series is born at its first value, which rate() cannot see as an
            # increase: one failure first, scraped, then the surge.
            rollouts(1)
            wait(lambda: counted("transport_timeout") == 1, "the first transport_timeout counted")
            rollouts(29)

            def surge_firing():
                return any(
                    alert["labels"]["alertname"] == "NgFailureKindSurge"
                    and alert["labels"]["ng_failure_kind"] == "transport_timeout"
                    and alert["state"] == "firing"
                    for alert in api(base, "/api/v1/alerts")["alerts"]
                )

            wait(surge_firing, lambda: f"NgFailureKindSurge to fire: {log.read_text()[-2000:]}")
            wait(lambda: counted("transport_timeout") == 30, "30 transport_timeout counted")
            # Each server is scraped on its own schedule: wait for the agent's count too (harness
            # and agent, once each per rollout).
            wait(lambda: counted("agent_run_error") == 60, "60 agent_run_error counted")
            series = api(base, "/api/v1/series", **{"match[]": "ng_failures_total"})
            labels = {label for item in series for label in item} - {"__name__", "job", "instance"}
            bounded = {name.replace(".", "_") for name in names.METRIC_LABELS}
            scope = {label for label in labels if label.startswith("otel_scope_")}
            assert labels - scope == bounded
    finally:
        server.terminate()
        server.wait(timeout=15)
