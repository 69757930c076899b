import gc
import logging

import pytest
from inline_snapshot import Is, snapshot
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from ng_otel import observe_failure, record_failure
from ng_otel.contract import FailureReport, NgFailureEvent, failure_report_for, rebuild_failure
from ng_otel.integrations._exchange import observe_reply
from ng_otel.otel import names
from ng_otel.otel.links import LinkIndex, decode_context_header, encode_context_header, format_span_context
from ng_otel.otel.recorder import get_recorder, install_recorder
from ng_otel.testing import CapturedTelemetry, capture_failures, fresh_state, internal_errors_logged
from tests.conftest import SdkError, model_timeout, raise_chain, three_level


def test_three_level_chain_in_one_span_exports_events_and_error_status_without_self_links():
    top = three_level()
    harness, model = top.__cause__, top.__cause__.__cause__
    with capture_failures() as telemetry:
        with telemetry.tracer.start_as_current_span("POST /run"):
            record_failure(top)
    (span,) = telemetry.spans()
    assert span == snapshot(
        {
            "name": "POST /run",
            "context": {"trace_id": 1, "span_id": 1},
            "parent": None,
            "status": "ERROR",
            "attributes": {"error.type": "agent_run_error"},
            "events": [
                {
                    "name": "ng.failure",
                    "attributes": {
                        "ng.failure.id": Is(model.event_id),
                        "ng.failure.boundary": "model",
                        "ng.failure.kind": "transport_timeout",
                        "ng.failure.reason": "model timed out",
                        "ng.failure.recovered": False,
                        "ng.failure.class": "infra",
                        "http.response.status_code": 504,
                        "ng.failure.operation": "chat_completions",
                    },
                },
                {
                    "name": "ng.failure",
                    "attributes": {
                        "ng.failure.id": Is(harness.event_id),
                        "ng.failure.boundary": "harness",
                        "ng.failure.kind": "agent_run_error",
                        "ng.failure.reason": "harness gave up",
                        "ng.failure.recovered": False,
                        "ng.failure.class": "data",
                        "ng.failure.cause_id": Is(model.event_id),
                        "ng.failure.stage": "agent",
                    },
                },
                {
                    "name": "ng.failure",
                    "attributes": {
                        "ng.failure.id": Is(top.event_id),
                        "ng.failure.boundary": "agent",
                        "ng.failure.kind": "agent_run_error",
                        "ng.failure.reason": "run failed",
                        "ng.failure.recovered": False,
                        "ng.failure.class": "infra",
                        "ng.failure.cause_id": Is(harness.event_id),
                        "ng.failure.stage": "agent",
                        "http.response.status_code": 500,
                    },
                },
            ],
            "links": [],  # every cause is on this same span: ng.failure.cause_id says so
        }
    )
    assert telemetry.chain() == ["agent_run_error", "agent_run_error", "transport_timeout"]
    assert telemetry.metric_points() == snapshot(
        [
            {
                "attributes": {
                    "ng.failure.boundary": "agent",
                    "ng.failure.kind": "agent_run_error",
                    "ng.failure.recovered": False,
                    "ng.failure.class": "infra",
                    "ng.failure.stage": "agent",
                },
                "value": 1,
            },
            {
                "attributes": {
                    "ng.failure.boundary": "harness",
                    "ng.failure.kind": "agent_run_error",
                    "ng.failure.recovered": False,
                    "ng.failure.class": "data",
                    "ng.failure.stage": "agent",
                },
                "value": 1,
            },
            {
                "attributes": {
                    "ng.failure.boundary": "model",
                    "ng.failure.kind": "transport_timeout",
                    "ng.failure.recovered": False,
                    "ng.failure.class": "infra",
                },
                "value": 1,
            },
        ]
    )


def test_metric_attributes_are_only_the_bounded_ones():
    with capture_failures() as telemetry:
        record_failure(raise_chain(SdkError("secret-token-123", 503), three_level()))
    for point in telemetry.metric_points():
        assert set(point["attributes"]) <= names.METRIC_LABELS
        assert not any("secret" in str(value) for value in point["attributes"].values())


def test_recording_the_same_event_again_adds_nothing():
    top = three_level()
    with capture_failures() as telemetry:
        with telemetry.tracer.start_as_current_span("a"):
            record_failure(top)
        with telemetry.tracer.start_as_current_span("b"):
            record_failure(top)
            record_failure(failure_report_for(top))
            observe_failure(top.__cause__)
    spans = telemetry.spans()
    assert [len(span["events"]) for span in spans] == [3, 0]
    assert spans[1]["links"] == [] and spans[1]["status"] == "UNSET"
    assert telemetry.count() == 3
    telemetry.assert_exported_once()


def test_chain_across_two_processes_links_to_the_exact_spans_of_causes():
    model_process, agent_process = CapturedTelemetry(), CapturedTelemetry()
    model_process.tracer_provider.id_generator.generate_span_id = lambda: 0xAAAA
    model_process.tracer_provider.id_generator.generate_trace_id = lambda: 0x77
    cause = model_timeout()
    with model_process.tracer.start_as_current_span("POST /v1/chat"):
        model_process.recorder.record(failure_report_for(cause), own=True)
    report_header = failure_report_for(cause).to_header()
    context_header = encode_context_header(model_process.recorder.index.contexts_for([cause.event_id]))
    assert context_header == f'{{"{cause.event_id}":"{0x77:032x}-{0xAAAA:016x}"}}'

    received = FailureReport.from_header(report_header)
    agent_process.recorder.learn_remote(received, decode_context_header(context_header))
    top = raise_chain(rebuild_failure(received), NgFailureEvent("agent_run_error", "run failed", boundary="agent"))
    with agent_process.tracer.start_as_current_span("POST /run"):
        agent_process.recorder.record(failure_report_for(top), own=True)

    (model_span,) = model_process.spans()
    (agent_span,) = agent_process.spans()
    assert [e["attributes"]["ng.failure.id"] for e in model_span["events"]] == [cause.event_id]
    assert [e["attributes"]["ng.failure.id"] for e in agent_span["events"]] == [top.event_id]
    assert agent_span["links"] == [
        {
            "context": {"trace_id": 0x77, "span_id": 0xAAAA},
            "attributes": {
                "ng.link.type": "caused_by",
                "ng.failure.id": top.event_id,
                "ng.failure.cause_id": cause.event_id,
            },
        }
    ]
    assert model_process.count() == 1 and agent_process.count() == 1


def test_learning_a_callees_map_says_whether_any_event_is_left_to_export_here():
    cause = model_timeout()
    top = raise_chain(cause, NgFailureEvent("agent_run_error", "run failed", boundary="agent"))
    report = failure_report_for(top)
    where = SpanContext(0x77, 0xAAAA, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    with capture_failures() as telemetry:
        # the read-back skips its recording pass on True, so True must mean every event is known
        assert telemetry.recorder.learn_remote(report, {cause.event_id: where}) is False
        assert telemetry.recorder.learn_remote(report, {cause.event_id: where, top.event_id: where}) is True
        assert telemetry.recorder.learn_remote(failure_report_for(model_timeout()), None) is True
        assert set(telemetry.recorder.index.recorded_at([cause.event_id, top.event_id])) == {
            cause.event_id,
            top.event_id,
        }


def test_a_reply_whose_map_names_only_some_events_has_the_others_exported_by_its_reader():
    cause = model_timeout()
    top = raise_chain(cause, NgFailureEvent("agent_run_error", "run failed", boundary="agent"))
    headers = {
        "X-NG-Failure-Report": failure_report_for(top).to_header(),
        "X-NG-Failure-Context": f'{{"{cause.event_id}":"{0x77:032x}-{0xAAAA:016x}"}}',
    }
    with capture_failures() as telemetry:
        with telemetry.tracer.start_as_current_span("POST /run"):
            observe_reply(headers.get, "harness")
            observe_reply(headers.get, "harness")  # read back again: nothing twice
    (span,) = telemetry.spans()
    assert [e["attributes"]["ng.failure.id"] for e in span["events"]] == [top.event_id]
    assert [link["context"] for link in span["links"]] == [{"trace_id": 0x77, "span_id": 0xAAAA}]
    assert telemetry.count() == 1


def test_omitted_context_map_means_exported_elsewhere_and_unlinked():
    with capture_failures() as telemetry:
        received = failure_report_for(model_timeout())
        telemetry.recorder.learn_remote(received, decode_context_header('{"omitted":true}'))
        top = raise_chain(rebuild_failure(received), NgFailureEvent("agent_run_error", "r", boundary="agent"))
        with telemetry.tracer.start_as_current_span("POST /run"):
            record_failure(top)
    (span,) = telemetry.spans()
    assert [e["attributes"]["ng.failure.kind"] for e in span["events"]] == ["agent_run_error"]
    assert span["links"] == []


def test_sampled_out_traces_are_still_counted():
    with capture_failures() as telemetry:
        unsampled = TracerProvider(sampler=ALWAYS_OFF).get_tracer("x")
        with unsampled.start_as_current_span("dropped"):
            record_failure(three_level())
    assert telemetry.spans() == []
    assert telemetry.count() == 3


def test_ended_span_gets_a_short_late_span_in_the_same_trace_with_links_at_creation():
    top = three_level()
    with capture_failures() as telemetry:
        with telemetry.tracer.start_as_current_span("POST /run") as request_span:
            pass
        record_failure(top, span=request_span)
    request, *late = telemetry.spans()
    assert request["events"] == [] and request["status"] == "UNSET"
    assert [span["name"] for span in late] == [
        "ng.failure transport_timeout",
        "ng.failure agent_run_error",
        "ng.failure agent_run_error",
    ]
    assert all(span["context"]["trace_id"] == request["context"]["trace_id"] for span in late)
    assert all(span["parent"] == request["context"] for span in late)
    assert [len(span["links"]) for span in late] == [0, 1, 1]
    assert late[1]["links"][0]["context"] == late[0]["context"]
    assert late[2]["status"] == "ERROR" and late[1]["status"] == "UNSET"
    telemetry.assert_linked()


def test_a_failure_outside_any_span_starts_its_own_trace():
    with capture_failures() as telemetry:
        record_failure(model_timeout())
    (span,) = telemetry.spans()
    assert span["name"] == "ng.failure transport_timeout" and span["parent"] is None


def test_recovered_failures_never_set_error_status():
    with capture_failures() as telemetry:
        with telemetry.tracer.start_as_current_span("POST /run"):
            observe_failure(model_timeout())
    (span,) = telemetry.spans()
    assert span["status"] == "UNSET" and "error.type" not in span["attributes"]
    assert span["events"][0]["attributes"]["ng.failure.recovered"] is True
    assert telemetry.count(recovered=True) == 1


def test_recovered_events_of_a_report_are_off_its_failure_chain():
    top = three_level()
    retried = model_timeout()
    report = failure_report_for(top).merge(failure_report_for(retried))
    with capture_failures() as telemetry:
        record_failure(report)
    recovered = {e["ng.failure.id"]: e["ng.failure.recovered"] for e in telemetry.failure_events()}
    assert recovered[retried.event_id] is True
    assert [recovered[r["event_id"]] for r in report.chain()] == [False, False, False]


def test_an_error_set_by_someone_else_is_not_overwritten():
    with capture_failures() as telemetry:
        with telemetry.tracer.start_as_current_span("POST /run") as span:
            span.set_status(Status(StatusCode.ERROR, "upstream said so"))
            span.set_attribute("error.type", "500")
            record_failure(model_timeout())
    (exported,) = telemetry.spans()
    assert exported["attributes"]["error.type"] == "500"
    assert telemetry.span_exporter.get_finished_spans()[0].status.description == "upstream said so"


def test_cardinality_guard_labels_invalid_and_excess_kinds():
    with capture_failures(max_kinds=2) as telemetry:
        for kind in ["made_up_a", "made_up_b", "made_up_c", "made_up_d", "made_up_a", "transport_timeout"]:
            record_failure(NgFailureEvent(kind, "r", boundary="agent"))
        hostile = {"event_id": "x1", "boundary": "agent", "failure_kind": "x" * 500, "failure_reason": "r"}
        telemetry.recorder.record(FailureReport._trusted({"x1": hostile}), own=False)
    by_kind = {}
    for point in telemetry.metric_points():
        kind = point["attributes"]["ng.failure.kind"]
        by_kind[kind] = by_kind.get(kind, 0) + point["value"]
    assert by_kind == {"made_up_a": 2, "made_up_b": 1, "_other": 2, "transport_timeout": 1, "_invalid": 1}
    assert "made_up_c" in {e["ng.failure.kind"] for e in telemetry.failure_events()}


def test_logs_mode_emits_a_log_record_per_failure_in_the_span_context():
    with capture_failures(signals="spans,logs") as telemetry:
        with telemetry.tracer.start_as_current_span("POST /run"):
            record_failure(model_timeout())
    (log,) = telemetry.log_records()
    (span,) = telemetry.spans()
    assert log["event_name"] == "ng.failure"
    assert log["attributes"] == span["events"][0]["attributes"]
    assert (log["trace_id"], log["span_id"]) == (span["context"]["trace_id"], span["context"]["span_id"])


def test_logs_only_mode_emits_no_span_events():
    with capture_failures(signals="logs") as telemetry:
        with telemetry.tracer.start_as_current_span("POST /run"):
            record_failure(model_timeout())
    assert telemetry.failure_events() == [] and len(telemetry.log_records()) == 1
    assert telemetry.count() == 1


def test_a_raising_exporter_never_reaches_the_caller():
    class Broken(InMemorySpanExporter):
        def export(self, spans):
            raise RuntimeError("collector exploded")

    with capture_failures() as telemetry:
        telemetry.tracer_provider.add_span_processor(SimpleSpanProcessor(Broken()))
        with telemetry.tracer.start_as_current_span("POST /run"):
            record_failure(model_timeout())
    assert telemetry.count() == 1


def test_internal_errors_are_swallowed_and_logged_once(caplog, monkeypatch):
    with fresh_state(), capture_failures() as telemetry:  # no earlier test's warning counts as the one

        def explode(*args, **kwargs):
            raise RuntimeError("meter broke")

        monkeypatch.setattr(telemetry.recorder, "record", explode)
        with caplog.at_level(logging.DEBUG, logger="ng_otel"), internal_errors_logged():
            record_failure(model_timeout())
            record_failure(model_timeout())
            record_failure("not a failure")  # type: ignore[arg-type]
            record_failure(model_timeout(), span=object())  # type: ignore[arg-type]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "internal error in _record (RuntimeError: meter broke)" in warnings[0].getMessage()
    assert "model timed out" not in caplog.text


def test_under_the_test_suite_an_internal_error_fails_the_test_that_caused_it(monkeypatch):
    # The ng_otel pytest plugin turns raising on, for this suite and users' suites alike.
    with capture_failures() as telemetry:

        def explode(*args, **kwargs):
            raise RuntimeError("meter broke")

        monkeypatch.setattr(telemetry.recorder, "record", explode)
        with pytest.raises(RuntimeError, match="meter broke"):
            record_failure(model_timeout())


def test_disabled_is_a_flag_check():
    with capture_failures() as telemetry:
        install_recorder(telemetry.recorder, enabled=False)  # capture_failures restores the flag
        record_failure(model_timeout())
        observe_failure(model_timeout())
    assert telemetry.spans() == [] and telemetry.count() == 0


def test_link_index_is_an_lru_with_flat_memory():
    index = LinkIndex(capacity=1000)
    from opentelemetry.trace import INVALID_SPAN_CONTEXT

    for number in range(1_000_000):
        index.add(str(number), INVALID_SPAN_CONTEXT)
    assert len(index) == 1000
    assert "999999" in index and "998999" not in index
    index.get("999000")
    index.add("new", INVALID_SPAN_CONTEXT)
    assert "999000" in index and "999001" not in index


def test_link_index_gives_back_the_contexts_it_was_given_and_keeps_nothing_the_collector_walks():
    from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, TraceFlags, TraceState

    from ng_otel.otel.links import NOT_EXPORTED

    given = {
        "sampled": SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)),
        "remote": SpanContext(3, 4, is_remote=True, trace_flags=TraceFlags(TraceFlags.DEFAULT)),
        "odd flags": SpanContext(5, 6, is_remote=True, trace_flags=TraceFlags(0x81)),
        "with state": SpanContext(7, 8, is_remote=False, trace_state=TraceState([("vendor", "x")])),
        "invalid": INVALID_SPAN_CONTEXT,
        "not exported": NOT_EXPORTED,
    }
    index = LinkIndex()
    for event_id, context in given.items():
        assert index.add(event_id, context)
    for event_id, context in given.items():
        back = index.get(event_id)
        assert back == context and back.trace_flags == context.trace_flags and back.trace_state == context.trace_state
    assert index.get("invalid") is INVALID_SPAN_CONTEXT and index.get("not exported") is NOT_EXPORTED
    assert set(index.contexts_for(given)) == set(given) - {"not exported"}
    # The header's form says the same, whichever way an entry is kept.
    assert index.recorded_at(given) == {
        event_id: format_span_context(context) for event_id, context in index.contexts_for(given).items()
    }
    zeros, sampled = f"{0:032x}-{0:016x}", f"{1:032x}-{2:016x}"
    assert index.recorded_at(["invalid", "sampled"]) == {"invalid": zeros, "sampled": sampled}

    # A full index costs every full garbage collection nothing per entry: a SpanContext and its
    # TraceFlags each per event would be 20,000 objects at the default size.
    gc.collect()
    before = len(gc.get_objects())
    full = LinkIndex(capacity=10_000)
    for number in range(10_000):
        full.add(f"{number:032x}", SpanContext(number + 1, 1, is_remote=True, trace_flags=TraceFlags(1)))
    gc.collect()
    assert len(gc.get_objects()) - before < 100
    shared = full.contexts_for([f"{0:032x}", f"{1:032x}"])
    assert [context.trace_id for context in shared.values()] == [1, 2]


@pytest.mark.parametrize(
    "value",
    [
        "{}x",
        "[]",
        '{"a": 1}',
        '{"a": "zz-1"}',
        f'{{"bad id": "{1:032x}-{1:016x}"}}',
        f'{{"a": "{0:032x}-{1:016x}"}}',
        f'{{"a": "{1:032x}-{0:016x}"}}',
    ],
)
def test_malformed_context_headers_raise_value_error(value):
    with pytest.raises(ValueError, match="X-NG-Failure-Context"):
        decode_context_header(value)


def test_events_recorded_with_count_off_are_exported_but_never_counted():
    with capture_failures() as telemetry:
        try:
            raise NgFailureEvent("transport_timeout", "model timed out", boundary="model")
        except NgFailureEvent as error:
            report = failure_report_for(error)
        with telemetry.tracer.start_as_current_span("replay"):
            assert get_recorder().record(report, own=True, count=False) == 1
    assert [e["ng.failure.kind"] for e in telemetry.failure_events()] == ["transport_timeout"]
    assert telemetry.count() == 0
