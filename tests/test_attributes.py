"""A failure record as its ng.failure event's attributes and back: lossless for every field
the record declares, through the recorder and through OTLP JSON as the after-the-run readers
read it."""

import json

from hypothesis import assume, given
from hypothesis import strategies as st

from ng_otel import NgFailureEvent, failure_report_for, record_failure
from ng_otel.contract.events import RECORD_ADAPTER, REQUIRED_RECORD_KEYS, FailureRecord, ForeignErrorRecord
from ng_otel.otel import names
from ng_otel.otel.attributes import event_attributes, record_of
from ng_otel.runs.otlp import otlp_line_failures
from ng_otel.testing import capture_failures

ids = st.from_regex(r"\A[a-z0-9]{1,32}\Z")
texts = st.text(max_size=200)
records = st.fixed_dictionaries(
    {
        "event_id": ids,
        "boundary": st.sampled_from(["model", "agent", "collection"]),
        "failure_kind": st.sampled_from(["transport_timeout", "srv:own_kind"]),
        "failure_reason": texts,
    },
    optional={
        "stage": st.sampled_from(["seed", "verification"]),
        "http_status": st.integers(100, 599),
        "operation": st.from_regex(r"\A[a-z/._:-]{1,20}\Z"),
        "cause_id": ids,
        "foreign_error": st.fixed_dictionaries(
            {"type": st.from_regex(r"\A[A-Za-z.]{1,30}\Z"), "message": texts},
            optional={"http_status": st.integers(100, 599)},
        ),
    },
)


def test_every_field_the_record_declares_has_its_event_attribute():
    # A field added to the record without one would be dropped by every event silently.
    flat = {key for key, _ in names.RECORD_ATTRIBUTES}
    assert flat | {"foreign_error"} == set(FailureRecord.__annotations__)
    assert {key for key, _ in names.FOREIGN_ATTRIBUTES} == set(ForeignErrorRecord.__annotations__)
    attributes = [attribute for _, attribute in (*names.RECORD_ATTRIBUTES, *names.FOREIGN_ATTRIBUTES)]
    assert set(attributes) <= set(names.EVENT_ATTRIBUTES) and len(set(attributes)) == len(attributes)


@given(records)
def test_a_record_survives_its_event_attributes(record):
    assert record_of(event_attributes(record)) == {**record, "recovered": False}


@given(records)
def test_an_events_attributes_keep_the_records_field_order(record):
    # The exported bytes of an event are its attributes in this order, whatever the record's own.
    flat = [attribute for key, attribute in names.RECORD_ATTRIBUTES if key in record]
    foreign = [attribute for key, attribute in names.FOREIGN_ATTRIBUTES if key in record.get("foreign_error", {})]
    assert list(event_attributes(dict(reversed(record.items())))) == flat + foreign


@given(records)
def test_a_record_survives_the_recorder_and_otlp_json(record):
    # What the recorder exported, as ng-otel receive writes it and show, summary and report read it.
    assume(record.get("cause_id") != record["event_id"])  # an event is not its own cause
    event = NgFailureEvent.from_record({key: value for key, value in record.items() if key != "cause_id"})
    if "cause_id" in record:  # a cause is an event of the chain, recorded with it
        cause = {"event_id": record["cause_id"], "boundary": "model", "failure_kind": "transport_timeout"}
        event.__cause__ = NgFailureEvent.from_record({**cause, "failure_reason": "root"})
    with capture_failures() as telemetry:
        record_failure(event)
    (exported,) = (item for item in telemetry.failure_events() if item[names.ID] == record["event_id"])
    line = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
                "scopeSpans": [{"spans": [{"traceId": "ab" * 16, "events": [_otlp_event(exported)]}]}],
            }
        ]
    }
    (failure,), skipped = otlp_line_failures(1, json.loads(json.dumps(line)), set())
    assert skipped is None
    read = record_of(failure[1])
    assert {key: read[key] for key in record} == record


def _otlp_event(attributes):
    def value(item):
        if isinstance(item, bool):
            return {"boolValue": item}
        if isinstance(item, int):
            return {"intValue": str(item)}
        return {"stringValue": item}

    return {"name": names.EVENT, "attributes": [{"key": k, "value": value(v)} for k, v in attributes.items()]}


def test_the_saved_rows_fast_path_checks_a_field_it_has_no_hand_check_for_by_the_record(monkeypatch):
    from ng_otel.contract import rows
    from ng_otel.gym.collection import report_row

    assert rows._FAST_CHECKED <= rows._OPTIONAL_KEYS
    assert set(RECORD_ADAPTER.json_schema()["required"]) == REQUIRED_RECORD_KEYS
    event = NgFailureEvent("transport_timeout", "model timed out", boundary="model", operation="/v1/responses")
    record = event.to_record()
    assert rows._declared_record(record)
    assert not rows._declared_record({**record, "operation": "POST /v1/responses\n"})
    # A field added to the record comes with no hand check: "operation" stands in for it, and
    # the record's own declaration decides (here a spy that answers as told).
    monkeypatch.setattr(rows, "_HAND_CHECKED_KEYS", rows._HAND_CHECKED_KEYS - {"operation"})
    asked, answer = [], [True]
    monkeypatch.setattr(rows, "_declared_record", lambda checked: asked.append(checked) or answer[0])
    saved = report_row(failure_report_for(event), {})
    fast = rows._canonical_saved_report(saved)
    assert asked == [record] and fast is not None and fast.events == rows.row_report(saved).events
    answer[0] = False
    assert rows._canonical_saved_report(saved) is None  # to the slow path, which names what is wrong


@given(records)
def test_a_saved_row_of_any_record_takes_the_fast_path_and_reads_as_the_slow_one(record):
    from ng_otel.contract import rows
    from ng_otel.gym.collection import report_row

    assume("cause_id" not in record)  # a cause is an event of the report: tested with chains
    saved = report_row(failure_report_for(NgFailureEvent.from_record(record)), {})
    fast = rows._canonical_saved_report(saved)
    assert fast is not None and fast.events == rows.row_report(saved).events
