import pickle
import re

import cloudpickle
import pytest
from inline_snapshot import Is, snapshot

from ng_otel.contract.events import (
    MAX_REASON_CHARS,
    TRUNCATION_MARKER,
    ForeignError,
    NgFailureEvent,
    gym_chain_records,
    gym_event_view,
    is_gym_failure,
)
from tests.conftest import SdkError, TheirGymEvent, raise_chain


def model_timeout(**extra):
    return NgFailureEvent("transport_timeout", "model server timed out", boundary="model", http_status=504, **extra)


def test_event_id_is_assigned_at_construction_as_32_lowercase_hex():
    first, second = model_timeout(), model_timeout()
    assert re.fullmatch(r"[0-9a-f]{32}", first.event_id)
    assert first.event_id != second.event_id


def test_record_leaves_out_absent_evidence():
    event = NgFailureEvent("judge_failed", "judge down", boundary="resources_server")
    assert event.to_record() == snapshot(
        {
            "event_id": Is(event.event_id),
            "boundary": "resources_server",
            "failure_kind": "judge_failed",
            "failure_reason": "judge down",
        }
    )


def test_full_record_round_trips():
    event = NgFailureEvent(
        "swe:patch_failed",
        "patch did not apply",
        boundary="environment",
        stage="verification",
        http_status=422,
        operation="verify",
        foreign_error=ForeignError("git.GitError", "conflict", 409),
    )
    record = event.to_record()
    again = NgFailureEvent.from_record(record)
    assert again.to_record() == record
    assert again.event_id == event.event_id
    assert isinstance(again, NgFailureEvent) and str(again) == "swe:patch_failed: patch did not apply"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"boundary": "gateway"}, "boundary"),
        ({"boundary": "model", "stage": "teardown"}, "stage"),
        ({"boundary": "model", "http_status": 99}, "http_status"),
        ({"boundary": "model", "http_status": 600}, "http_status"),
        ({"boundary": "model", "http_status": True}, "http_status"),
        ({"boundary": "model", "http_status": "500"}, "http_status"),
        ({"boundary": "model", "operation": "a b"}, "operation"),
        ({"boundary": "model", "operation": "x" * 129}, "operation"),
        ({"boundary": "model", "foreign_error": {"type": "X"}}, "foreign_error"),
    ],
)
def test_constructor_rejects_bad_fields_naming_them(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}"):
        NgFailureEvent("transport_timeout", "reason", **kwargs)


@pytest.mark.parametrize("kind", ["Transport_Timeout", "transport timeout", "a:b:c", "", "x" * 129, "ok\n"])
def test_constructor_rejects_malformed_kinds(kind):
    with pytest.raises(ValueError, match=r"^failure_kind"):
        NgFailureEvent(kind, "reason", boundary="model")


def test_unregistered_well_formed_kind_is_kept():
    assert NgFailureEvent("browser_crashed", "r", boundary="environment").failure_kind == "browser_crashed"


def test_reason_at_the_bound_is_kept_and_past_it_is_cut_with_marker_inside_budget():
    exact = "a" * MAX_REASON_CHARS
    assert NgFailureEvent("cancelled", exact, boundary="agent").failure_reason == exact
    cut = NgFailureEvent("cancelled", exact + "b", boundary="agent").failure_reason
    assert len(cut) == MAX_REASON_CHARS
    assert cut.endswith(TRUNCATION_MARKER)
    assert cut.startswith("a" * (MAX_REASON_CHARS - len(TRUNCATION_MARKER)))


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"boundary": "nowhere"}, "boundary"),
        ({"stage": "later"}, "stage"),
        ({"http_status": 600}, "http_status"),
        ({"http_status": 500.0}, "http_status"),
        ({"http_status": None}, "http_status"),
        ({"event_id": "has space"}, "event_id"),
        ({"event_id": "x" * 129}, "event_id"),
        ({"cause_id": ""}, "cause_id"),
        ({"failure_kind": "Bad Kind"}, "failure_kind"),
        ({"failure_reason": "r" * (MAX_REASON_CHARS + 1)}, "failure_reason"),
        ({"failure_reason": 7}, "failure_reason"),
        ({"foreign_error": {"type": "", "message": "m"}}, "foreign_error.type"),
    ],
)
def test_from_record_rejects_bad_records_naming_the_field(record, field):
    base = model_timeout().to_record()
    with pytest.raises(ValueError, match=rf"invalid failure record: {re.escape(field)}"):
        NgFailureEvent.from_record({**base, **record})


def test_from_record_drops_unknown_keys_and_keeps_the_event():
    base = model_timeout(foreign_error=ForeignError("openai.APITimeoutError", "slow", 504)).to_record()
    sent = {
        **base,
        "model_failure_details": {"model": "m", "attempts": 3},
        "foreign_error": {**base["foreign_error"], "sdk_request_id": "req-1"},
    }
    assert NgFailureEvent.from_record(sent).to_record() == base


def test_ids_are_opaque_to_decoders():
    record = {**model_timeout().to_record(), "event_id": "gym:run-7.attempt_2", "cause_id": "A-1"}
    event = NgFailureEvent.from_record(record)
    assert event.event_id == "gym:run-7.attempt_2"
    assert event.cause_id == "A-1"


def test_cause_comes_only_from_the_explicit_chain():
    cause = model_timeout()
    try:
        try:
            raise cause
        except NgFailureEvent:
            raise NgFailureEvent("agent_run_error", "implicit", boundary="agent")  # noqa: B904
    except NgFailureEvent as implicit:
        assert implicit.__context__ is cause
        assert implicit.cause_id is None
    explicit = raise_chain(model_timeout(), NgFailureEvent("agent_run_error", "explicit", boundary="agent"))
    assert explicit.cause_id == explicit.__cause__.event_id


def test_foreign_intermediary_supplies_foreign_error_and_keeps_the_link():
    bottom = model_timeout()
    top = raise_chain(
        bottom,
        SdkError("rate limited", 429),
        KeyError("deeper foreign is not the nearest"),
        NgFailureEvent("judge_failed", "judge call failed", boundary="resources_server"),
    )
    record = top.to_record()
    assert record["cause_id"] == bottom.event_id
    assert record["foreign_error"] == {"type": "KeyError", "message": "'deeper foreign is not the nearest'"}
    middle = raise_chain(bottom, SdkError("rate limited", 429))
    top2 = raise_chain(middle, NgFailureEvent("judge_failed", "x", boundary="resources_server"))
    assert top2.to_record()["foreign_error"] == {
        "type": "tests.conftest.SdkError",
        "message": "rate limited",
        "http_status": 429,
    }


def test_an_explicit_foreign_error_is_not_replaced_by_the_chain():
    given = ForeignError("openai.APIError", "given")
    top = raise_chain(
        SdkError("chain", 500), NgFailureEvent("judge_failed", "x", boundary="model", foreign_error=given)
    )
    assert top.foreign_error == given


def test_foreign_message_is_bounded_and_a_broken_str_is_survived():
    class Hostile(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert ForeignError.from_exception(Hostile()).message == "<unprintable Hostile>"
    long = ForeignError.from_exception(ValueError("m" * 5000))
    assert len(long.message) == MAX_REASON_CHARS and long.message.endswith(TRUNCATION_MARKER)


def test_foreign_status_ignores_non_int_and_out_of_range_values():
    class Weird(Exception):
        status_code = "500"
        status = 1000
        http_status = 503

    assert ForeignError.from_exception(Weird()).http_status == 503


@pytest.mark.parametrize("dumps,loads", [(pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)])
def test_pickle_keeps_ids_explicit_causes_and_foreign_error(dumps, loads):
    bottom = model_timeout()
    top = raise_chain(
        bottom, SdkError("overloaded", 503), NgFailureEvent("agent_run_error", "run failed", boundary="agent")
    )
    again = loads(dumps(top))
    assert again.to_record() == top.to_record()
    assert isinstance(again.__cause__, NgFailureEvent)
    assert again.__cause__.to_record() == bottom.to_record()
    assert again.foreign_error == ForeignError("tests.conftest.SdkError", "overloaded", 503)


def test_pickle_of_a_10000_deep_chain_does_not_recurse():
    top = raise_chain(*(NgFailureEvent("cancelled", str(i), boundary="agent") for i in range(10_000)))
    again = pickle.loads(pickle.dumps(top))
    depth, current = 0, again
    while current is not None:
        depth, current = depth + 1, current.__cause__
    assert depth == 10_000


def test_a_cycle_in_the_cause_chain_ends_the_walk():
    first, second = model_timeout(), NgFailureEvent("agent_run_error", "x", boundary="agent")
    first.__cause__, second.__cause__ = second, first
    assert first.cause_id == second.event_id
    assert len(pickle.loads(pickle.dumps(first)).to_record()) > 0


# --- an exception following Gym's documented NgFailureEvent API, not our class ---------------


def test_an_exception_following_the_api_is_a_gym_failure_and_others_are_not():
    assert is_gym_failure(model_timeout())
    assert is_gym_failure(TheirGymEvent("judge_failed", "r", boundary="resources_server", event_id="t1"))
    assert not is_gym_failure(ValueError("v"))
    assert not is_gym_failure("not an exception")

    class Hostile(Exception):
        def __getattr__(self, name):
            raise RuntimeError(name)

    assert not is_gym_failure(Hostile())


def test_their_event_is_our_cause_and_its_cause_is_the_next_gym_event_in_the_chain():
    bottom = model_timeout()
    theirs = TheirGymEvent(
        "judge_failed",
        "judge down",
        boundary="resources_server",
        event_id="their-1",
        record_extra={"sandbox_failure_details": {"pod": "p"}},
    )
    top = raise_chain(
        bottom, SdkError("overloaded", 503), theirs, NgFailureEvent("agent_run_error", "x", boundary="agent")
    )
    assert top.cause_id == "their-1" and top.cause is theirs
    records = gym_chain_records(top)
    assert [r["event_id"] for r in records] == [top.event_id, "their-1", bottom.event_id]
    assert records[1] == snapshot(
        {
            "event_id": "their-1",
            "boundary": "resources_server",
            "failure_kind": "judge_failed",
            "failure_reason": "judge down",
            "cause_id": Is(bottom.event_id),
            "foreign_error": {"type": "tests.conftest.SdkError", "message": "overloaded", "http_status": 503},
        }
    )


@pytest.mark.parametrize(
    "theirs",
    [
        TheirGymEvent("judge_failed", "r", boundary="gateway", event_id="t1"),
        TheirGymEvent("judge_failed", "r" * (MAX_REASON_CHARS + 1), boundary="agent", event_id="t1"),
        TheirGymEvent("judge_failed", "r", boundary="agent", event_id="has space"),
        TheirGymEvent("judge_failed", "r", boundary="agent", event_id="t1", broken=True),
    ],
)
def test_their_event_with_an_invalid_record_is_a_foreign_exception_never_an_error(theirs):
    top = raise_chain(theirs, NgFailureEvent("agent_run_error", "x", boundary="agent"))
    assert not gym_event_view(theirs)
    (record,) = gym_chain_records(top)
    assert "cause_id" not in record
    assert record["foreign_error"]["type"] == "tests.conftest.TheirGymEvent"


def test_a_chain_of_theirs_pickles_into_ours_with_ids_kept():
    theirs = TheirGymEvent("session_lost", "lost", boundary="environment", event_id="their-2")
    top = raise_chain(model_timeout(), theirs, NgFailureEvent("agent_run_error", "x", boundary="agent"))
    again = pickle.loads(pickle.dumps(top))
    assert isinstance(again.__cause__, NgFailureEvent) and again.__cause__.event_id == "their-2"
    assert again.to_record() == top.to_record()
