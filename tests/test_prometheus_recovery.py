"""Real Prometheus (Debian's package) scraping real retry loops: Gym 0.7.0's own request loop
running out of connection retries fires NgRetriesExhausted, and a rollout in flight past its
stall age fires NgRolloutStalled, which clears when the rollout ends."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import unused_port, wait_until
from tests.test_prometheus import api, binary, listening_address, rules_without_waits, wait
from tests.test_recovery import wheel_source

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]


def firing(base: str, alert: str) -> list[dict]:
    alerts = api(base, "/api/v1/alerts")["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == alert and a["state"] == "firing"]


def test_real_prometheus_fires_exhaustion_and_stalled_alerts_from_real_retry_loops(tmp_path: Path):
    wheel_source()  # the retry loop below is the wheel's own
    prometheus = binary("prometheus")
    port = unused_port()
    rules = rules_without_waits(tmp_path)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "gym", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
    }
    log = tmp_path / "prometheus.log"
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            "--web.listen-address=127.0.0.1:0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    gym = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "recovery" / "exhaust.py"), str(tmp_path)],
        env=env,
        stdout=(tmp_path / "gym.log").open("wb"),
        stderr=subprocess.STDOUT,
    )

    def phase(number: int) -> None:
        (tmp_path / f"go-{number}").write_text("")

    def counted(outcome: str) -> float:
        query = f'sum(ng_retry_outcomes_total{{ng_retry_outcome="{outcome}"}})'
        result = api(base, "/api/v1/query", query=query)["result"]
        return float(result[0]["value"][1]) if result else 0.0

    try:
        base = f"http://{listening_address(server, log)}"
        targets = lambda: api(base, "/api/v1/targets")["activeTargets"]  # noqa: E731
        wait(lambda: any(t["health"] == "up" for t in targets()), "the loop scraped")
        # A counter series is born at its first value, which increase() cannot see: one
        # exhausted loop first, scraped, then the second, which the alert sees.
        phase(1)
        wait(lambda: counted("failed_after_retry") == 1, "the first exhausted loop counted")
        phase(2)
        wait(lambda: counted("failed_after_retry") == 2, "the second exhausted loop counted")
        wait(lambda: firing(base, "NgRetriesExhausted"), lambda: f"the alert to fire: {log.read_text()[-2000:]}")
        (alert,) = firing(base, "NgRetriesExhausted")
        labels = alert["labels"]
        assert (labels["ng_failure_boundary"], labels["ng_failure_kind"]) == ("agent", "transport_peer_drop")

        phase(3)
        wait(lambda: firing(base, "NgRolloutStalled"), "NgRolloutStalled to fire for the hung rollout")
        phase(4)
        wait_until(lambda: not firing(base, "NgRolloutStalled"), 60, "NgRolloutStalled to clear once it ended")
    finally:
        (tmp_path / "stop").write_text("")
        try:
            gym.wait(timeout=15)
        except subprocess.TimeoutExpired:
            gym.kill()
        server.terminate()
        server.wait(timeout=15)
    assert gym.returncode == 0, (tmp_path / "gym.log").read_text()[-3000:]
