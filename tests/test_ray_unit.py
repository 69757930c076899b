"""The Ray adapter's parts that need no Ray: the carrier rule, a failure leaving a carried call,
and arriving in the caller (real Ray: ``tests/test_ray.py``)."""

from __future__ import annotations

import inspect
import pickle

import pytest
from opentelemetry import trace

from ng_otel.contract import NgFailureEvent, failure_report_for
from ng_otel.contract.classify import FailureClass
from ng_otel.integrations import ray as ng_ray
from ng_otel.testing import capture_failures
from tests.conftest import raise_chain

TRACE_ID = 0x1234
CALLER_SPAN_ID = 0x5678
CARRIER = {"traceparent": f"00-{TRACE_ID:032x}-{CALLER_SPAN_ID:016x}-01"}


def typed_failure(status: int = 503) -> NgFailureEvent:
    return NgFailureEvent("agent_request_failed", "Gym /run failed", boundary="collection", http_status=status)


class FakeTaskError(Exception):
    """What ``ray.get`` raises, as far as the adapter reads it: the failure in ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("task failed")
        self.cause = cause


def test_recorded_at_crosses_a_pickle_with_the_chain_and_names_only_its_events():
    top = raise_chain(NgFailureEvent("provider_unavailable", "down", boundary="model"), typed_failure())
    cause_id = top.cause_id
    top.recorded_at = {top.event_id: f"{1:032x}-{2:016x}", cause_id: f"{1:032x}-{3:016x}", "stranger": "x"}
    arrived = pickle.loads(pickle.dumps(top))
    assert arrived.event_id == top.event_id and arrived.cause_id == cause_id
    assert arrived.recorded_at == {top.event_id: f"{1:032x}-{2:016x}", cause_id: f"{1:032x}-{3:016x}"}
    assert pickle.loads(pickle.dumps(typed_failure())).recorded_at is None
    assert len(typed_failure().__reduce__()[1]) == 1  # unset, the pickled form is what it was


@pytest.mark.parametrize(
    ("declared", "kwargs", "in_span", "carried"),
    [
        (True, {}, True, True),
        (True, {ng_ray.KEYWORD: {"traceparent": "theirs"}}, True, False),  # Ray's tracing or NeMo-RL's carrier
        (False, {}, True, False),  # a generator method or a cross-language callee
        (True, {}, False, False),  # no span: nothing to carry
    ],
)
def test_the_carrier_goes_only_where_the_callee_declares_it_and_nobody_carried_one(declared, kwargs, in_span, carried):
    params = [inspect.Parameter("x", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if declared:
        params.append(inspect.Parameter(ng_ray.KEYWORD, inspect.Parameter.KEYWORD_ONLY, default=None))
    with capture_failures() as captured:
        if in_span:
            with captured.tracer.start_as_current_span("driver") as span:
                result = ng_ray._with_carrier(params, kwargs)
                expected_trace = f"{span.get_span_context().trace_id:032x}"
        else:
            result = ng_ray._with_carrier(params, kwargs)
    if carried:
        assert expected_trace in result[ng_ray.KEYWORD]["traceparent"]
    else:
        assert result is kwargs


def test_a_failure_leaving_a_carried_call_is_recorded_there_and_the_caller_links_to_it_exporting_nothing_twice():
    seen_trace = []

    def method() -> None:
        seen_trace.append(trace.get_current_span().get_span_context().trace_id)
        raise typed_failure() from None  # NeMo-RL's typed failure

    with capture_failures() as actor:
        with pytest.raises(NgFailureEvent) as raised:
            ng_ray.run_carried(CARRIER, method, (), {})
    assert seen_trace == [TRACE_ID]  # the caller's context was current in the call
    (actor_event,) = actor.failure_events()
    (actor_span,) = actor.spans()
    assert actor_span["context"]["trace_id"] == TRACE_ID and actor_span["parent"]["span_id"] == CALLER_SPAN_ID
    where = f"{TRACE_ID:032x}-{actor_span['context']['span_id']:016x}"
    assert raised.value.recorded_at == {raised.value.event_id: where}

    arrived = pickle.loads(pickle.dumps(raised.value))
    task_error = FakeTaskError(arrived)
    with capture_failures() as driver:
        ng_ray._arrived(task_error, arrived)
        assert ng_ray.failure_class(task_error) is FailureClass.INFRA
        own = raise_chain(task_error, NgFailureEvent("agent_request_failed", "rollout failed", boundary="harness"))
        with driver.tracer.start_as_current_span("rollout"):
            driver.recorder.record(failure_report_for(own), own=True)
    assert [e["ng.failure.id"] for e in driver.failure_events()] == [own.event_id]
    (driver_span,) = driver.spans()
    assert [link["context"] for link in driver_span["links"]] == [actor_span["context"]]
    assert actor_event["ng.failure.id"] == arrived.event_id


def test_a_failure_passing_through_claims_the_spans_its_callee_recorded_and_flushes_nothing():
    server_failure = typed_failure(502)
    with capture_failures() as actor:
        actor.recorder.learn_remote(failure_report_for(server_failure), {server_failure.event_id: CALLER_CONTEXT})

        def method() -> None:
            raise server_failure

        with pytest.raises(NgFailureEvent):
            ng_ray.run_carried(CARRIER, method, (), {})
    assert actor.failure_events() == []  # the server exported it
    assert server_failure.recorded_at == {server_failure.event_id: f"{TRACE_ID:032x}-{CALLER_SPAN_ID:016x}"}


@pytest.mark.parametrize(("status", "expected"), [(503, "infra"), (429, "infra"), (408, "infra"), (400, "data")])
def test_failure_class_decides_a_status_as_nemo_rl_s_http_status_is_infra(status, expected):
    assert ng_ray.failure_class(FakeTaskError(typed_failure(status))).value == expected  # unpatched: read .cause
    assert ng_ray.failure_class(ValueError("no Gym failure")) is None


CALLER_CONTEXT = trace.SpanContext(TRACE_ID, CALLER_SPAN_ID, is_remote=True)
