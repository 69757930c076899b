"""The ``ng_otel`` pytest plugin (entry point ``pytest11``), for users' own Gym servers:

    def test_a_model_timeout_fails_the_rollout(ng_otel_capture, client):
        client.post("/run", json={"scenario": "model_timeout"})
        ng_otel_capture.assert_chain("agent_run_error", "agent_run_error", "transport_timeout")

``ng_otel_capture`` records the failure telemetry of the code under test in memory (spans,
events, links, metric points, log records; see ``ng_otel.testing.CapturedTelemetry``) and
restores the previous recorder afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ng_otel.testing import CapturedTelemetry, capture_failures


@pytest.fixture
def ng_otel_capture() -> Iterator[CapturedTelemetry]:
    """Failure telemetry of this test, in memory, with deterministic ids."""
    with capture_failures() as captured:
        yield captured
