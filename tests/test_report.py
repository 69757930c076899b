import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ng_otel.contract.events import BOUNDARIES, STAGES, NgFailureEvent
from ng_otel.contract.header import MAX_HEADER_BYTES, OMITTED_VALUE, encode_ascii_json
from ng_otel.contract.kinds import FAILURE_KINDS
from ng_otel.contract.report import FailureReport, failure_report_for, find_boundary_failure, rebuild_failure
from tests.conftest import SdkError, TheirGymEvent, raise_chain, three_level


def three_level_chain():
    """The shared three-level chain and its events, top first."""
    top = three_level()
    return top, (top, top.__cause__, top.__cause__.__cause__)


def test_report_names_the_top_event_and_links_causes():
    top, (agent, harness, model) = three_level_chain()
    report = failure_report_for(top)
    assert report.failure_id == agent.event_id
    assert [r["event_id"] for r in report.chain()] == [agent.event_id, harness.event_id, model.event_id]
    assert report.events[harness.event_id]["cause_id"] == model.event_id
    assert "cause_id" not in report.events[model.event_id]


def test_no_gym_event_means_no_report():
    assert failure_report_for(raise_chain(ValueError("a"), KeyError("b"))) is None


def test_foreign_exception_above_every_gym_event_is_dropped():
    bottom = NgFailureEvent("judge_failed", "judge down", boundary="resources_server")
    top = raise_chain(bottom, RuntimeError("wrapper"))
    report = failure_report_for(top)
    assert list(report.events) == [bottom.event_id]
    assert report.failure_id == bottom.event_id


def test_implicit_context_never_makes_a_cause():
    try:
        try:
            raise NgFailureEvent("transport_timeout", "t", boundary="model")
        except NgFailureEvent:
            raise NgFailureEvent("agent_run_error", "a", boundary="agent")  # noqa: B904
    except NgFailureEvent as top:
        assert len(failure_report_for(top)) == 1


def test_a_10000_exception_chain_reports_without_recursion_error():
    layers = []
    for index in range(10_000):
        layers.append(NgFailureEvent("cancelled", str(index), boundary="agent") if index % 2 else SdkError("s", 500))
    top = raise_chain(*layers)
    limit = sys.getrecursionlimit()
    report = failure_report_for(top)
    assert len(report) == 5_000
    assert len(report.chain()) == 5_000
    assert sys.getrecursionlimit() == limit
    assert FailureReport.from_dict(report.to_dict()) == report


def test_a_cyclic_cause_chain_yields_an_acyclic_report():
    first = NgFailureEvent("transport_timeout", "t", boundary="model")
    second = NgFailureEvent("agent_run_error", "a", boundary="agent")
    first.__cause__, second.__cause__ = second, first
    report = failure_report_for(second)
    assert [r["event_id"] for r in report.chain()] == [second.event_id, first.event_id]
    assert FailureReport.from_dict(report.to_dict()) == report


def test_a_recorded_cause_id_whose_cause_is_absent_is_not_reported():
    lone = NgFailureEvent.from_record({**three_level_chain()[0].to_record()})
    assert lone.cause_id is not None
    report = failure_report_for(lone)
    assert "cause_id" not in report.events[lone.event_id]


def test_rebuild_restores_ids_and_explicit_causes():
    top, chain = three_level_chain()
    rebuilt = rebuild_failure(FailureReport.from_header(failure_report_for(top).to_header()))
    ids, current = [], rebuilt
    while current is not None:
        ids.append(current.event_id)
        current = current.__cause__
    assert ids == [event.event_id for event in chain]
    assert rebuilt.to_record() == top.to_record()
    assert rebuild_failure(FailureReport()) is None


def test_their_gym_events_are_reported_and_found_like_ours():
    bottom = NgFailureEvent("transport_timeout", "t", boundary="model")
    theirs = TheirGymEvent("judge_failed", "judge down", boundary="resources_server", event_id="their-1")
    top = raise_chain(bottom, theirs, RuntimeError("wrapper"))
    assert find_boundary_failure(top) is theirs
    report = failure_report_for(top)
    assert report.failure_id == "their-1"
    assert [r["event_id"] for r in report.chain()] == ["their-1", bottom.event_id]
    broken = TheirGymEvent("judge_failed", "r", boundary="resources_server", event_id="t", broken=True)
    assert find_boundary_failure(raise_chain(broken, RuntimeError("w"))) is None
    assert failure_report_for(broken) is None


def test_find_boundary_failure_looks_only_down_the_explicit_chain():
    bottom = NgFailureEvent("judge_failed", "j", boundary="resources_server")
    assert find_boundary_failure(raise_chain(bottom, KeyError("k"), RuntimeError("r"))) is bottom
    assert find_boundary_failure(ValueError("v")) is None


def test_merge_keeps_ids_own_failure_id_and_the_omitted_flag():
    top, _ = three_level_chain()
    own = failure_report_for(top)
    recovered = failure_report_for(NgFailureEvent("transport_timeout", "retried", boundary="model"))
    merged = own.merge(recovered)
    assert merged.failure_id == own.failure_id
    assert set(merged.events) == set(own.events) | set(recovered.events)
    assert merged.recovered_ids() == frozenset(recovered.events)
    assert FailureReport().merge(recovered).failure_id is None
    assert own.merge(FailureReport.from_header(OMITTED_VALUE)).omitted
    assert FailureReport(omitted=True).merge(own).omitted


def test_merge_keeps_this_sides_record_on_a_repeated_id():
    ours = FailureReport({"a": record("a"), "b": record("b", cause_id="a")}, failure_id="b")
    theirs = FailureReport({"a": record("a", failure_kind="shutdown"), "c": record("c", cause_id="a")})
    merged = ours.merge(theirs)
    assert merged.events["a"]["failure_kind"] == "cancelled"
    assert set(merged.events) == {"a", "b", "c"}
    assert FailureReport.from_dict(merged.to_dict()) == merged


def test_chain_of_an_unknown_event_is_a_key_error():
    with pytest.raises(KeyError):
        FailureReport().chain("nope")


# --- validation of decoded reports --------------------------------------------------


def record(event_id, **extra):
    base = {"event_id": event_id, "boundary": "agent", "failure_kind": "cancelled", "failure_reason": "r"}
    return base | extra


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"events": {"a": record("b")}}, "events.a: key differs"),
        ({"events": {"a": record("a", cause_id="zz")}}, "events.a.cause_id: zz is not in the report"),
        ({"events": {"a": record("a", cause_id="b"), "b": record("b", cause_id="a")}}, "form a cycle"),
        ({"events": {"a": record("a", cause_id="a")}}, "form a cycle"),
        ({"failure_id": "q", "events": {}}, "failure_id: q is not in the report"),
        ({"events": []}, "events"),
        ({"events": {"a": "not a record"}}, "events.a"),
        ({"omitted": "yes"}, "omitted"),
        ({"events": {"bad id": record("bad id")}}, "events.bad id"),
    ],
)
def test_from_dict_rejects_invalid_reports_naming_the_field(payload, message):
    with pytest.raises(ValueError, match="invalid failure report") as caught:
        FailureReport.from_dict(payload)
    assert message in str(caught.value)


def test_unknown_keys_are_dropped_and_every_event_is_kept():
    sent = {
        "schema_version": 2,
        "failure_id": "a",
        "events": {
            "a": record("a", cause_id="b", model_failure_details={"model": "m"}),
            "b": record("b", sandbox_failure_details={"pod": "p"}, foreign_error={"type": "E", "message": "m", "x": 1}),
        },
        "model_failure_details": {"a": {"model": "m"}},
    }
    report = FailureReport.from_dict(sent)
    assert report.to_dict() == {
        "failure_id": "a",
        "events": {"a": record("a", cause_id="b"), "b": record("b", foreign_error={"type": "E", "message": "m"})},
    }
    assert FailureReport.from_header(json.dumps(sent)) == report


def test_constructor_validates_like_from_dict():
    with pytest.raises(ValueError, match="cycle"):
        FailureReport({"a": record("a", cause_id="a")})


def test_error_messages_do_not_echo_hostile_values():
    secret = "sk-live-SECRET\r\nX-Injected: 1"
    with pytest.raises(ValueError) as caught:
        FailureReport.from_dict({"events": {"a": record("a", failure_reason=5, stage=secret)}})
    assert "SECRET" not in str(caught.value) and "\n" not in str(caught.value)


def test_report_is_immutable():
    report = FailureReport()
    with pytest.raises(AttributeError):
        report.failure_id = "x"
    with pytest.raises(TypeError):
        report.events["x"] = {}


# --- the header codec ------------------------------------------------------------------


def test_header_is_compact_ascii_json_with_non_ascii_and_controls_escaped():
    event = NgFailureEvent("judge_failed", "réponse invalide\r\nX-Evil: 1 \u2028 ☃", boundary="resources_server")
    value = failure_report_for(event).to_header()
    assert value.isascii()
    assert "\r" not in value and "\n" not in value
    assert FailureReport.from_header(value).events[event.event_id]["failure_reason"] == event.failure_reason


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=500)
@given(_JSON_VALUES)
def test_the_fast_encoder_writes_exactly_what_the_escaping_encoder_writes(value):
    # The fast path must never differ from json's ensure_ascii output: a header value may hold
    # visible ASCII and spaces only (DEL and everything non-ASCII escaped).
    expected = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    encoded = encode_ascii_json(value)
    assert encoded == expected
    assert all(" " <= char <= "~" for char in encoded)


def _report_of_encoded_size(size):
    cause = NgFailureEvent("judge_failed", "", boundary="agent")
    top = raise_chain(cause, NgFailureEvent("judge_failed", "", boundary="agent"))
    extra = size - len(failure_report_for(top).to_header())
    cause.failure_reason, top.failure_reason = "x" * min(2000, extra), "x" * (extra - min(2000, extra))
    return failure_report_for(top)


def test_a_report_of_exactly_4096_bytes_is_sent_and_one_byte_more_is_omitted():
    at_bound = _report_of_encoded_size(MAX_HEADER_BYTES)
    assert len(at_bound.to_header()) == MAX_HEADER_BYTES
    assert FailureReport.from_header(at_bound.to_header()) == at_bound
    past = _report_of_encoded_size(MAX_HEADER_BYTES + 1)
    assert past.to_header() == OMITTED_VALUE == '{"omitted":true}'
    assert FailureReport.from_header(past.to_header()).omitted


def test_omitted_flag_travels_with_events():
    top, _ = three_level_chain()
    report = failure_report_for(top).merge(FailureReport(omitted=True))
    again = FailureReport.from_header(report.to_header())
    assert again.omitted and again == report


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x" * (MAX_HEADER_BYTES + 1), "over the 4096-byte bound"),
        ('{"events":{}, "x": "é"}', "not ASCII"),
        (b"\xff", "not ASCII"),
        (7, "must be a string"),
        ("not json", "invalid failure report"),
        ('{"events": {"a": 1}}', "events.a"),
        ("[]", "invalid failure report"),
        (
            '{"events":{"a":{"event_id":"a","boundary":"agent","failure_kind":"cancelled","failure_reason":"a\nb"}}}',
            "invalid failure report",
        ),
    ],
)
def test_from_header_rejects_malformed_values_with_a_clear_error(value, message):
    with pytest.raises(ValueError, match=message):
        FailureReport.from_header(value)


def test_duplicate_ids_in_a_header_are_rejected_or_collapsed_never_silently_inconsistent():
    one = json.dumps(record("a"))
    two = json.dumps(record("a", failure_kind="shutdown"))
    decoded = FailureReport.from_header('{"events":{"a":' + one + ',"a":' + two + "}}")
    assert len(decoded) == 1 and decoded.events["a"]["event_id"] == "a"


# --- property-based round trips --------------------------------------------------------

ids = st.from_regex(r"[A-Za-z0-9._:-]{1,40}", fullmatch=True)
texts = st.text(max_size=300)
kinds = st.sampled_from(sorted(FAILURE_KINDS)) | st.from_regex(
    r"[a-z][a-z0-9_]{0,10}:[a-z][a-z0-9_]{0,10}", fullmatch=True
)


@st.composite
def records_(draw, event_id):
    result = {
        "event_id": event_id,
        "boundary": draw(st.sampled_from(BOUNDARIES)),
        "failure_kind": draw(kinds),
        "failure_reason": draw(texts),
    }
    if draw(st.booleans()):
        result["stage"] = draw(st.sampled_from(STAGES))
    if draw(st.booleans()):
        result["http_status"] = draw(st.integers(100, 599))
    if draw(st.booleans()):
        result["operation"] = draw(st.from_regex(r"[a-z_]{1,20}", fullmatch=True))
    if draw(st.booleans()):
        foreign = {"type": draw(st.from_regex(r"[A-Za-z.]{1,30}", fullmatch=True)), "message": draw(texts)}
        if draw(st.booleans()):
            foreign["http_status"] = draw(st.integers(100, 599))
        result["foreign_error"] = foreign
    return result


@st.composite
def reports(draw):
    event_ids = draw(st.lists(ids, min_size=0, max_size=8, unique=True))
    events = {}
    for index, event_id in enumerate(event_ids):
        item = draw(records_(event_id))
        if index and draw(st.booleans()):  # causes point to earlier events only: acyclic
            item["cause_id"] = event_ids[draw(st.integers(0, index - 1))]
        events[event_id] = item
    failure_id = draw(st.sampled_from(event_ids)) if event_ids and draw(st.booleans()) else None
    return FailureReport(events, failure_id, draw(st.booleans()))


@settings(max_examples=200, deadline=None)
@given(reports())
def test_dict_and_header_round_trips(report):
    assert FailureReport.from_dict(report.to_dict()) == report
    value = report.to_header()
    assert value.isascii() and len(value) <= MAX_HEADER_BYTES
    decoded = FailureReport.from_header(value)
    assert decoded == report or value == OMITTED_VALUE


@settings(max_examples=200, deadline=None)
@given(reports())
def test_every_record_round_trips_through_an_event(report):
    for item in report.events.values():
        assert NgFailureEvent.from_record(item).to_record() == item


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=500),
        st.binary(max_size=500),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
            max_leaves=20,
        ).map(json.dumps),
    )
)
def test_hostile_header_values_raise_only_value_error(value):
    try:
        FailureReport.from_header(value)
    except ValueError:
        pass
