"""A NeMo Gym 0.7.0 failed reply's nested body read as the chain of servers it names.

Bodies are built as Gym 0.7.0 builds them: each server's catch-all
(``setup_exception_middleware`` in ``nemo_gym/server_utils.py``) answers
``f"Hit an exception in {key} calling an inner server: {e.response_content}"`` as a JSON 500
(Starlette's own ``JSONResponse`` renders it here), ``response_content`` being the callee's
body as bytes, and collection keeps the first 2,000 characters (``_truncated_body``).
``tests/test_real_gym.py`` reads bodies a real Gym wrote.
"""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import JSONResponse

from ng_otel.contract.events import MAX_REASON_CHARS
from ng_otel.contract.inner_errors import (
    EMPTY_CHAIN,
    GYM_ERROR_STATUS,
    MAX_BODY_CHARS,
    MAX_HOPS,
    NO_INNER_REASON,
    RUN_ERROR_KINDS,
    SERVER_BOUNDARIES,
    InnerHop,
    chain_records,
    class_boundary,
    inner_event_id,
    parse_inner_error,
    row_chain_records,
)
from ng_otel.contract.report import FailureReport
from ng_otel.contract.rows import row_report

PROVIDER_ERROR = json.dumps({"error": {"message": "backend overloaded"}}).encode()
GYM_KEPT_CHARS = 2000  # rollout_collection._MAX_FAILURE_BODY_CHARS
HOSTILE_BODY_CHARS = 10 * 1024 * 1024
PARSE_SECONDS = 1.0  # a generous wall-clock bound for one hostile body (~0.1 s measured) on a busy 2-core machine
PARSE_PEAK_BYTES = 64 * MAX_BODY_CHARS  # what a parse may allocate, whatever the body


def gym_reply(key: str, inner: bytes) -> bytes:
    """The body Gym's catch-all answers when the server ``key`` got ``inner`` from a failed call."""
    return JSONResponse(f"Hit an exception in {key} calling an inner server: {inner!r}").body


def gym_body(*keys: str, core: bytes = PROVIDER_ERROR) -> str:
    """What collection saves for a failed /run whose servers ``keys`` (outermost first) failed
    in turn, the innermost because its provider answered ``core``."""
    body = core
    for key in reversed(keys):
        body = gym_reply(key, body)
    text = body[: GYM_KEPT_CHARS * 4].decode("utf-8", "replace")
    return text[:GYM_KEPT_CHARS] + ("…" if len(body) > GYM_KEPT_CHARS else "")


# The real lane's policy_500 rollout: simple_agent's /run called its own /v1/responses, which
# called the policy model, whose provider answered 500.
LANE_KEYS = (
    "SimpleAgent___simpleqa_simple_agent",
    "SimpleAgent___simpleqa_simple_agent",
    "SimpleModelServer___policy_model",
)
LANE_HOPS = (
    InnerHop("SimpleAgent", "simpleqa_simple_agent", "agent"),
    InnerHop("SimpleAgent", "simpleqa_simple_agent", "agent"),
    InnerHop("SimpleModelServer", "policy_model", "model"),
)


def failure_row(body: str | None, **extra) -> dict:
    """A sidecar row as 0.7.0's ``_agent_request_failure_row`` writes it."""
    return {
        "_ng_task_index": 1,
        "_ng_rollout_index": 0,
        "agent_ref": {"type": "responses_api_agents", "name": "simpleqa_simple_agent"},
        "_ng_failure_class": "agent_run_error",
        "_ng_failure_type": "ClientResponseError",
        "_ng_failure_message": "500, message='Internal Server Error', url='http://127.0.0.1:9/run'",
        "_ng_failure_http_status": 500,
        "_ng_failure_response_body": body,
        **extra,
    }


def outer_record(row: dict) -> dict:
    """Collection's own record of the row, as rows builds it before its body's chain."""
    report = row_report(row)
    assert report is not None
    return {key: value for key, value in report.events[report.failure_id].items() if key != "cause_id"}


# -- reading the body ------------------------------------------------------------------------


def test_the_lane_s_three_servers_are_read_outermost_first_with_the_provider_s_message():
    chain = parse_inner_error(gym_body(*LANE_KEYS))
    assert chain.hops == LANE_HOPS
    assert chain.reason == "backend overloaded"
    assert chain.cut is False


def test_the_issue_s_two_level_body_names_the_agent_then_the_model():
    chain = parse_inner_error(gym_body("SimpleAgent___simpleqa_simple_agent", "SimpleModelServer___policy_model"))
    assert [(h.class_name, h.server, h.boundary) for h in chain.hops] == [
        ("SimpleAgent", "simpleqa_simple_agent", "agent"),
        ("SimpleModelServer", "policy_model", "model"),
    ]
    assert chain.reason == "backend overloaded"


def test_a_body_cut_by_gym_s_bound_keeps_the_servers_it_still_names_and_says_it_was_cut():
    long_core = json.dumps({"error": {"message": "x" * 3000}}).encode()
    body = gym_body(*LANE_KEYS, core=long_core)
    assert body.endswith("…") and len(body) == GYM_KEPT_CHARS + 1
    chain = parse_inner_error(body)
    assert chain.hops == LANE_HOPS
    assert chain.cut is True
    assert chain.reason is not None and chain.reason.startswith('{"error": {"message": "xxx')


def test_a_provider_message_outside_ascii_comes_back_as_written():
    message = "バックエンド過負荷 — réessayez 🚦"
    chain = parse_inner_error(gym_body(*LANE_KEYS, core=json.dumps({"error": {"message": message}}).encode()))
    assert chain.reason == message
    # ensure_ascii=False too (Starlette's own choice): the UTF-8 bytes are \x-escaped in each repr.
    raw = json.dumps({"message": message}, ensure_ascii=False).encode()
    assert parse_inner_error(gym_body("SimpleModelServer___policy_model", core=raw)).reason == message


@pytest.mark.parametrize(
    ("core", "reason"),
    [
        (b'{"error": {"message": "rate limited", "type": "requests"}}', "rate limited"),  # OpenAI-compatible
        (b'{"message": "no healthy upstream"}', "no healthy upstream"),
        (b'{"detail": "Not Found"}', "Not Found"),  # FastAPI's HTTPException
        (b'{"error": "model not loaded"}', "model not loaded"),
        (b'{"error": {"code": 7}}', '{"error": {"code": 7}}'),  # no message: its text
        (b"upstream connect error or disconnect/reset before headers", None),  # not JSON: as is
        (b"   ", NO_INNER_REASON),
    ],
)
def test_the_innermost_reason_prefers_the_json_message_and_otherwise_keeps_the_text(core, reason):
    row = failure_row(gym_body("SimpleModelServer___policy_model", core=core))
    chain = parse_inner_error(row["_ng_failure_response_body"])
    expected = reason if reason is not None else core.decode()
    records = row_chain_records(row, outer_record(row)).records
    assert records[-1]["failure_reason"] == expected
    assert chain.reason == (None if expected == NO_INNER_REASON else expected)


def test_a_server_whose_handler_raised_is_not_named_and_its_repr_is_the_reason():
    # The model's handler raised (its provider dropped the connection): Gym answered repr(e)
    # as JSON, naming no server; the agent that called it is the innermost server named.
    model_reply = JSONResponse(repr(ConnectionResetError("Connection reset by peer"))).body
    chain = parse_inner_error(gym_body("SimpleAgent___simpleqa_simple_agent", core=model_reply))
    assert chain.hops == (InnerHop("SimpleAgent", "simpleqa_simple_agent", "agent"),)
    assert chain.reason == "ConnectionResetError('Connection reset by peer')"


@pytest.mark.parametrize(
    ("class_name", "boundary"),
    [
        ("SimpleAgent", "agent"),
        ("SimpleModelServer", "model"),
        ("VLLMModel", "model"),
        ("LLMJudgeResourcesServer", "resources_server"),
        ("LegacyAgentEnvironmentServer", "environment"),
        ("SimpleQAServer", None),  # a resources server by its base, not by its name: unknown
        ("SWEBenchWrapper", None),
    ],
)
def test_a_server_s_boundary_comes_from_how_gym_names_its_class(class_name, boundary):
    assert class_boundary(class_name) == boundary
    (hop,) = parse_inner_error(gym_body(f"{class_name}___some_server")).hops
    assert (hop.class_name, hop.server, hop.boundary) == (class_name, "some_server", boundary)


def test_a_server_the_caller_names_gets_that_boundary_whatever_its_class():
    body = gym_body("SimpleQAServer___simpleqa")
    assert parse_inner_error(body).hops[0].boundary is None
    assert parse_inner_error(body, server_boundaries={"simpleqa": "resources_server"}).hops[0].boundary == (
        "resources_server"
    )


@pytest.mark.parametrize("body", [None, 7, {"error": "x"}, ["x"], "", b""])
def test_anything_but_text_holds_no_chain(body):
    assert parse_inner_error(body) == EMPTY_CHAIN


def test_a_body_given_as_bytes_reads_as_its_text():
    assert parse_inner_error(gym_body(*LANE_KEYS).encode()).hops == LANE_HOPS


# -- the chain as failure records ------------------------------------------------------------


def test_a_row_s_chain_is_collection_caused_by_each_server_effect_first_with_the_provider_s_reason_at_the_root():
    row = failure_row(gym_body(*LANE_KEYS))
    outer = outer_record(row)
    chain = row_chain_records(row, outer)
    report = FailureReport(events={r["event_id"]: r for r in chain.records}, failure_id=outer["event_id"])  # validates
    walked = report.chain()
    assert [(r["boundary"], r["failure_kind"]) for r in walked] == [
        ("collection", "agent_run_error"),
        ("agent", "agent_run_error"),
        ("agent", "agent_run_error"),
        ("model", "provider_unavailable"),
    ]
    assert chain.servers == (None, "simpleqa_simple_agent", "simpleqa_simple_agent", "policy_model")
    assert walked[-1]["failure_reason"] == "backend overloaded"
    assert walked[1]["failure_reason"] == "simpleqa_simple_agent got a failed reply 500 from simpleqa_simple_agent"
    assert all(r["http_status"] == GYM_ERROR_STATUS for r in walked[1:])
    assert {k: v for k, v in walked[0].items() if k != "cause_id"} == outer  # collection's record as rows builds it
    assert chain.server_by_event() == {r["event_id"]: s for r, s in zip(walked[1:], chain.servers[1:], strict=True)}


def test_reading_a_row_twice_names_the_same_failures_and_two_rows_name_different_ones():
    row = failure_row(gym_body(*LANE_KEYS))
    first = row_chain_records(row, outer_record(row))
    assert row_chain_records(dict(row), outer_record(dict(row))) == first
    ids = [r["event_id"] for r in first.records]
    assert len(set(ids)) == len(ids)
    assert ids[1:] == [inner_event_id(ids[0], index) for index in range(len(LANE_HOPS))]
    other = failure_row(gym_body(*LANE_KEYS), _ng_task_index=2)
    assert not set(ids) & {r["event_id"] for r in row_chain_records(other, outer_record(other)).records}


def test_inner_kinds_are_the_ones_the_live_path_gives_each_boundary():
    from ng_otel.gym import failures
    from ng_otel.gym.failures import STATUS_KINDS

    assert failures.RUN_ERROR_KINDS is RUN_ERROR_KINDS and SERVER_BOUNDARIES <= set(RUN_ERROR_KINDS)  # one table
    assert GYM_ERROR_STATUS not in STATUS_KINDS  # a callee's 500 names no kind of its own


def test_a_server_of_unknown_kind_makes_no_event_and_the_chain_goes_on_past_it():
    row = failure_row(gym_body("SimpleAgent___simpleqa_simple_agent", "SWEBenchWrapper___swe", "VLLMModel___policy"))
    chain = row_chain_records(row, outer_record(row))
    assert chain.servers == (None, "simpleqa_simple_agent", "policy")
    assert chain.records[1]["failure_reason"] == "simpleqa_simple_agent got a failed reply 500 from swe"
    assert (
        chain.records[1]["cause_id"] == chain.records[2]["event_id"] == inner_event_id(chain.records[0]["event_id"], 2)
    )


def test_rows_whose_body_names_no_server_are_the_outer_record_alone():
    for row in (failure_row(None), failure_row("\"ValueError('bad')\""), failure_row(PROVIDER_ERROR.decode())):
        outer = outer_record(row)
        assert row_chain_records(row, outer) == ((outer,), (None,))


def test_an_outer_record_that_already_has_a_cause_is_left_as_it_is():
    row = failure_row(gym_body(*LANE_KEYS))
    outer = {**outer_record(row), "cause_id": "f" * 32}
    assert chain_records(outer, parse_inner_error(row["_ng_failure_response_body"])).records == (outer,)


# -- hostile bodies ----------------------------------------------------------------------------


def nested_without_bound(levels: int) -> str:
    """``levels`` hops of the same shape, built without Gym's 2,000-character cut, and no
    escaping blow-up: each level holds the next as text (content that was str, not bytes)."""
    return "".join(f"Hit an exception in SimpleAgent___a{i} calling an inner server: " for i in range(levels)) + "core"


def bounded(body):
    """Parse ``body``, asserting the bounds on time and memory every parse keeps (timed
    untraced: tracemalloc slows every allocation several times over)."""
    started = time.perf_counter()
    chain = parse_inner_error(body)
    elapsed = time.perf_counter() - started
    tracemalloc.start()
    try:
        assert parse_inner_error(body) == chain  # and the same answer every time
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < PARSE_SECONDS, elapsed
    assert peak < PARSE_PEAK_BYTES, peak
    assert len(chain.hops) <= MAX_HOPS
    assert chain.reason is None or len(chain.reason) <= MAX_REASON_CHARS
    (chain.reason or "").encode("utf-8")  # writable wherever a reason goes
    return chain


def test_a_body_nested_past_the_depth_bound_keeps_its_first_servers_and_the_rest_as_text():
    chain = bounded(nested_without_bound(10_000))
    assert [hop.server for hop in chain.hops] == [f"a{i}" for i in range(MAX_HOPS)]
    assert chain.cut is True
    assert chain.reason is not None and chain.reason.startswith(f"Hit an exception in SimpleAgent___a{MAX_HOPS} ")


def test_gym_s_own_nesting_past_the_depth_bound_stops_at_the_bound():
    body = PROVIDER_ERROR
    for level in range(MAX_HOPS + 4):
        body = gym_reply(f"SimpleAgent___a{level}", body)
        if len(body) > MAX_BODY_CHARS:
            break
    chain = bounded(body.decode())
    assert chain.hops and chain.hops[0].server == f"a{level}"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("x" * HOSTILE_BODY_CHARS, id="10 MB of text"),
        pytest.param('"' + "\\" * HOSTILE_BODY_CHARS, id="10 MB of backslashes in a JSON string"),
        pytest.param("\"Hit an exception in A___a calling an inner server: b'" + "\\x" * 5_000_000, id="cut escapes"),
        pytest.param("[" * HOSTILE_BODY_CHARS, id="10 MB of JSON nesting"),
        pytest.param("{" * MAX_BODY_CHARS, id="JSON nesting within the bound"),
        pytest.param(nested_without_bound(HOSTILE_BODY_CHARS // 64), id="10 MB of hops"),
        pytest.param("Hit an exception in " * 600_000, id="headers that never end"),
    ],
)
def test_a_ten_megabyte_body_is_read_within_the_bounds(body):
    chain = bounded(body)
    assert chain.cut is (len(body) > MAX_BODY_CHARS or len(chain.hops) == MAX_HOPS)


def test_a_body_that_names_itself_again_and_again_is_read_to_the_bound_and_no_further():
    # Looks cyclic: every level is the same server calling itself. Each level is shorter than
    # the one around it, so nothing can loop; the depth bound ends it.
    chain = bounded("Hit an exception in SimpleAgent___loop calling an inner server: " * 50_000)
    assert [hop.server for hop in chain.hops] == ["loop"] * MAX_HOPS and chain.cut


@pytest.mark.parametrize(
    ("literal", "reason"),
    [
        ("b'\\q\\x4\\xzz'", "\\q\\x4\\xzz"),  # escapes a bytes literal does not have: as written
        ("b'abc", "abc"),  # never closed
        ("b'\\", "\\"),  # cut inside an escape
        ("b'\\x00NUL\\x00'", "\x00NUL\x00"),
        ("b'\\xff\\xfe'", "\ufffd\ufffd"),  # not UTF-8: replaced, not raised
        ('b"it\'s"', "it's"),  # repr's other quote
        ("b'caf\u00e9'", "caf\u00e9"),  # not a repr (repr escapes non-ASCII): the text kept
    ],
)
def test_a_bytes_literal_that_is_odd_or_broken_is_read_as_far_as_it_goes(literal, reason):
    chain = bounded(f"Hit an exception in SimpleAgent___a calling an inner server: {literal}")
    assert chain.hops == (InnerHop("SimpleAgent", "a", "agent"),)
    assert chain.reason == reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('"\\ud83d\\ude00 \\ud800 \\udc00 \\u12 \\q"', "\U0001f600 \ufffd \ufffd \\u12 \\q"),
        ('"unterminated', "unterminated"),
        ('"\\', "\\"),
    ],
)
def test_a_json_string_that_is_odd_or_broken_is_read_as_far_as_it_goes(body, reason):
    assert bounded(body).reason == reason


@pytest.mark.parametrize(
    "body",
    [
        'Error { kind: ConnectionRefused, message: "connection refused" }',  # Rust's Debug
        '&errors.errorString{s:"dial tcp 127.0.0.1:9: connect: connection refused"}',  # Go's %#v
        "Error: socket hang up\n    at connResetException (node:internal/errors:720:14)",  # Node's
        "java.net.ConnectException: Connection refused\n\tat sun.nio.ch.Net.connect0(Native Method)",
        "Hit an exception in  calling an inner server: b''",  # no name
        "Hit an exception in Bad Class___x calling an inner server: b''",  # not a class name
        "Hit an exception in A___" + "s" * 500 + " calling an inner server: b''",  # a name past the bound
        "Hit an exception in A___x y calling an inner server: b''",  # not a config name
        "Hit an exception calling an inner server: boom",  # mcp_auto_exposure's, which names no server
    ],
)
def test_text_that_is_not_gym_s_hop_is_kept_as_the_reason(body):
    chain = bounded(body)
    assert chain.hops == ()
    assert chain.reason == body.strip()


def test_a_lone_surrogate_in_the_row_s_own_text_does_not_reach_the_reason():
    assert bounded("bad \ud800 text").reason == "bad ? text"


GYM_FRAGMENTS = st.sampled_from(
    ["Hit an exception in ", "SimpleAgent___a", " calling an inner server: ", "b'", 'b"', "'", '"', "\\", "\\x", "{"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(GYM_FRAGMENTS, st.text(max_size=40)), max_size=40).map("".join))
def test_any_text_is_read_within_the_bounds_and_never_raises(body):
    bounded(body)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["SimpleAgent", "SimpleModelServer", "VLLMModel", "MathResourcesServer", "SimpleQAServer"]),
            st.from_regex(r"[a-z][a-z0-9_]{0,30}", fullmatch=True),
        ),
        min_size=1,
        max_size=4,
    ),
    st.text(min_size=1, max_size=60).filter(lambda m: m.strip() == m and "\r" not in m),
)
def test_any_chain_gym_writes_reads_back_server_for_server_with_its_message(servers, message):
    keys = [f"{class_name}___{server}" for class_name, server in servers]
    body = gym_body(*keys, core=json.dumps({"error": {"message": message}}).encode())
    chain = parse_inner_error(body)
    if chain.cut:  # past Gym's 2,000 characters: the servers still read, the message may not
        assert [(h.class_name, h.server) for h in chain.hops] == servers[: len(chain.hops)]
    else:
        assert [(h.class_name, h.server) for h in chain.hops] == servers
        assert chain.reason == message.encode("utf-8", "replace").decode("utf-8")
