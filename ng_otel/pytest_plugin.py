"""The ``ng_otel`` pytest plugin (entry point ``pytest11``), for users' own Gym servers:

    def test_a_model_timeout_fails_the_rollout(ng_otel_capture, client):
        client.post("/run", json={"scenario": "model_timeout"})
        ng_otel_capture.assert_chain("agent_run_error", "agent_run_error", "transport_timeout")

``ng_otel_capture`` records the failure telemetry of the code under test in memory (spans,
events, links, metric points, log records; see ``ng_otel.testing.CapturedTelemetry``) and
restores the previous recorder afterwards.

Under pytest, an internal error of ng_otel raises in the test that caused it instead of being
logged and skipped as in production, so a bug fails a test rather than hiding in a log (ini
option ``ng_otel_raise_internal_errors = false`` turns that off; ``ng_otel.testing.
internal_errors_logged()`` does for one block, for tests of that production behaviour).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ng_otel.otel._guard import raise_internal_errors
from ng_otel.testing import CapturedTelemetry, capture_failures

RAISE_OPTION = "ng_otel_raise_internal_errors"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(RAISE_OPTION, "raise ng_otel's internal errors in tests (default true)", type="bool", default=True)


def pytest_configure(config: pytest.Config) -> None:
    raise_internal_errors(bool(config.getini(RAISE_OPTION)))


@pytest.fixture
def ng_otel_capture() -> Iterator[CapturedTelemetry]:
    """Failure telemetry of this test, in memory, with deterministic ids."""
    with capture_failures() as captured:
        yield captured
