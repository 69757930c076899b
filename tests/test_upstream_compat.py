"""ng_otel's records side by side with the released NeMo Gym code they must match.

The NeMo Gym 0.7.0 wheel comes from ``tools/real-gym.sh wheel`` (downloaded once into a cache,
on a fresh machine too); the test is skipped, saying so, only when that download fails. When a
newer nemo-gym appears, set ``NG_OTEL_GYM_VERSION`` and run this module: it is where the new
release is checked.

Upstream code executes here, it is never copied. ``failure_kinds.py``, ``episode_types.py``
and ``rollout_outcomes.py`` import only pydantic, so they are imported as they are, under a
bare ``nemo_gym`` package: Gym's own ``__init__`` rewrites ``sys.path`` and ``print`` and sets
environment variables, which a test process must not have done to it. The verify response
and the judge failsafe live in modules that pull in the whole server stack, so their
definitions (``BaseVerifyResponse``, ``JudgeError``, ``judge_failsafe``) are compiled from
the released file with the light imports that file makes; ``BaseVerifyResponse``'s base (the
request, made of OpenAI types) is a plain model here, which leaves its own four fields, their
validator and their defaults exactly as released.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import logging
import os
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from ng_otel.contract import (
    FAILURE_KINDS,
    STAGES,
    EpisodeFailure,
    EpisodeId,
    RolloutFailure,
    RolloutFailureRecord,
    VerifyOutcome,
    is_namespaced,
    is_registered,
    kinds,
)
from ng_otel.contract.events import MAX_REASON_CHARS
from ng_otel.gym.episodes import episode_response, handled_episode_failure, record_verify_outcome
from ng_otel.testing import capture_failures
from tests.conftest import FAILURE, rollout

REPO = Path(__file__).resolve().parents[1]
VERSION = os.environ.get("NG_OTEL_GYM_VERSION", "0.7.0")
CACHE = Path(os.environ.get("NG_OTEL_GYM_CACHE", Path.home() / ".cache" / "ng-otel"))
# Released modules that import nothing beyond pydantic: imported as they are.
LIGHT_MODULES = ("failure_kinds", "episode_types", "rollout_outcomes")


@pytest.fixture(scope="session")
def gym_wheel() -> Path:
    """The unzipped nemo-gym wheel; skipped only when it cannot be downloaded."""
    done = subprocess.run(
        ["bash", str(REPO / "tools" / "real-gym.sh"), "wheel"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        check=False,
    )
    if done.returncode != 0:
        reason = f"tools/real-gym.sh wheel failed: {done.stderr.strip()[-800:]}"
        if not list((CACHE / f"wheel-{VERSION}").glob("nemo_gym-*.whl")):
            pytest.skip(f"nemo-gym {VERSION} wheel could not be downloaded; {reason}")
        pytest.fail(reason)  # downloaded but not usable: that is a failure, not a skip
    return Path(done.stdout.strip().splitlines()[-1])


def _released_definitions(wheel: Path, module: str, names: tuple[str, ...], **stand_ins: Any) -> types.ModuleType:
    """A module holding ``names`` compiled from the released ``nemo_gym/<module>.py``, after the
    file's own imports of installed packages and of the light Gym modules; ``stand_ins`` take
    the place of what the definitions reach for in the server stack."""
    path = wheel / "nemo_gym" / f"{module}.py"
    tree = ast.parse(path.read_text(), str(path))
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.level == 0):
            source = node.names[0].name if isinstance(node, ast.Import) else node.module or ""
            if not source.startswith("nemo_gym") or source in {f"nemo_gym.{name}" for name in LIGHT_MODULES}:
                body.append(node)
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            body.append(node)
    found = {node.name for node in body if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    assert found == set(names), f"nemo_gym/{module}.py no longer defines {set(names) - found}"
    released = types.ModuleType(f"nemo_gym.{module}")
    released.__dict__.update(stand_ins)
    sys.modules[released.__name__] = released  # pydantic resolves annotations through it
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), released.__dict__)
    return released


class _RequestStandIn(BaseModel):
    """Where ``BaseVerifyResponse`` inherits the request (OpenAI types): its config, no fields."""

    model_config = ConfigDict(populate_by_name=True)


@pytest.fixture(scope="session")
def gym(gym_wheel: Path) -> Iterator[types.SimpleNamespace]:
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "nemo_gym"}
    package = types.ModuleType("nemo_gym")
    package.__path__ = [str(gym_wheel / "nemo_gym")]
    sys.modules["nemo_gym"] = package
    try:
        loaded = {name: importlib.import_module(f"nemo_gym.{name}") for name in LIGHT_MODULES}
        resources = _released_definitions(
            gym_wheel, "base_resources_server", ("BaseVerifyResponse",), BaseVerifyRequest=_RequestStandIn
        )
        judge = _released_definitions(gym_wheel, "judge", ("JudgeError", "judge_failsafe"))
        yield types.SimpleNamespace(
            **loaded,
            BaseVerifyResponse=resources.BaseVerifyResponse,
            JudgeError=judge.JudgeError,
            judge_failsafe=judge.judge_failsafe,
        )
    finally:
        for name in [name for name in sys.modules if name.split(".")[0] == "nemo_gym"]:
            del sys.modules[name]
        sys.modules.update(saved)


def outcome(model: type[BaseModel], data: Any) -> tuple[str, Any]:
    """``("ok", json)`` or ``("rejected", None)``: what one side makes of ``data``."""
    try:
        return "ok", json.loads(model.model_validate(data).model_dump_json())
    except ValidationError:
        return "rejected", None


def assert_same_both_ways(ours: type[BaseModel], theirs: type[BaseModel], data: Any) -> None:
    """Same acceptance, same JSON, and each side reads the other's JSON back to the same JSON."""
    mine, released = outcome(ours, data), outcome(theirs, data)
    assert mine == released
    if mine[0] == "ok":
        text = json.dumps(mine[1])
        assert (
            json.loads(ours.model_validate_json(theirs.model_validate_json(text).model_dump_json()).model_dump_json())
            == mine[1]
        )
        assert (
            json.loads(theirs.model_validate_json(ours.model_validate_json(text).model_dump_json()).model_dump_json())
            == mine[1]
        )


# --- EpisodeId ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"rollout_id": "task-3.r_1"},
        {"rollout_id": "r", "attempt": 4},
        {"rollout_id": "r", "attempt": "4"},
        {"rollout_id": "r", "attempt": 4.0},
        {"rollout_id": "r", "attempt": 4.5},
        {"rollout_id": "r-a0"},
        {"rollout_id": "r-a01"},
        {"rollout_id": "r-a1"},
        {"rollout_id": "r-a12"},
        {"rollout_id": ""},
        {"rollout_id": "-r"},
        {"rollout_id": "a b"},
        {"rollout_id": "r\n"},
        {"rollout_id": "r", "attempt": -1},
        {"rollout_id": "r", "extra": 1},
        {"attempt": 0},
        "r",
        None,
    ],
)
def test_episode_id_matches_upstream(gym, data):
    assert_same_both_ways(EpisodeId, gym.episode_types.EpisodeId, data)


def test_episode_id_capture_key_and_frozenness_match_upstream(gym):
    for attempt in (0, 3):
        mine = EpisodeId(rollout_id="r", attempt=attempt)
        assert mine.capture_key == gym.episode_types.EpisodeId(rollout_id="r", attempt=attempt).capture_key
    with pytest.raises(ValidationError):
        mine.attempt = 1  # type: ignore[misc]


# --- EpisodeFailure ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        FAILURE,
        {"failure_reason": "lost", "terminal": False},
        {"failure_reason": "lost", "terminal": False, "failure_kind": None, "stage": None},
        {"failure_reason": "lost", "terminal": "yes"},
        {"failure_reason": "lost", "terminal": 1},
        {"failure_reason": "lost", "terminal": "maybe"},
        {"failure_reason": "lost", "terminal": None},
        {"failure_reason": "lost"},
        {"failure_reason": "r" * MAX_REASON_CHARS, "terminal": True},
        {"failure_reason": "r" * (MAX_REASON_CHARS + 1), "terminal": True},
        {"failure_reason": 7, "terminal": True},
        {"failure_reason": "lost", "terminal": True, "failure_kind": "Not A Kind"},
        {"failure_reason": "lost", "terminal": True, "failure_kind": "browser:crashed"},
        {"failure_reason": "lost", "terminal": True, "failure_kind": 7},
        {"failure_reason": "lost", "terminal": True, "stage": "later"},
        {**FAILURE, "failure_report": {}},
        {**FAILURE, "partial_response": {}},
    ],
)
def test_episode_failure_matches_upstream(gym, data):
    assert_same_both_ways(EpisodeFailure, gym.episode_types.EpisodeFailure, data)
    if outcome(EpisodeFailure, data)[0] == "ok":  # the python dump omits unset fields too
        assert (
            EpisodeFailure.model_validate(data).model_dump()
            == gym.episode_types.EpisodeFailure.model_validate(data).model_dump()
        )


def test_stages_are_upstreams(gym):
    assert typing.get_args(gym.failure_kinds.FailureStage) == STAGES


# --- RolloutFailure ----------------------------------------------------------------------

ROLLOUT = rollout(episode_id={"rollout_id": "task-1", "attempt": 2})


@pytest.mark.parametrize(
    "data",
    [
        ROLLOUT,
        {**ROLLOUT, "schema_version": 1, "http_status": 503, "exception_type": "aiohttp.ServerDisconnectedError"},
        {**ROLLOUT, "source": "environment", "delivery": "delivered"},
        {**ROLLOUT, "failure": {"failure_reason": "no reply", "terminal": False}},
        {**ROLLOUT, "source": "environment", "delivery": "possibly_delivered"},
        {**ROLLOUT, "schema_version": 2},
        {**ROLLOUT, "unknown": 1},
        {**ROLLOUT, "run_id": ""},
        {**ROLLOUT, "episode_id": "task-1"},
        {**ROLLOUT, "episode_id": {"rollout_id": "task-a1"}},
        {**ROLLOUT, "http_status": 700},
        {**ROLLOUT, "http_status": 99},
        {**ROLLOUT, "exception_type": "E" * 2001},
        {**ROLLOUT, "delivery": "maybe"},
        {**ROLLOUT, "failure": {**FAILURE, "extra": 1}},
        {**ROLLOUT, "failure": {**FAILURE, "failure_reason": "r" * (MAX_REASON_CHARS + 1)}},
    ],
)
def test_rollout_failure_matches_upstream(gym, data):
    assert_same_both_ways(RolloutFailureRecord, gym.rollout_outcomes.RolloutFailure, data)


def test_rollout_failure_keeps_its_released_name_and_is_frozen_like_upstream(gym):
    assert RolloutFailure is RolloutFailureRecord
    for model in (RolloutFailureRecord, gym.rollout_outcomes.RolloutFailure):
        record = model.model_validate(ROLLOUT)
        with pytest.raises(ValidationError):
            record.run_id = "other"


# --- the verify response's fields ---------------------------------------------------------

VERIFY_FIELDS = ("reward", "mask_sample", "failure_kind", "failure_reason")


@pytest.mark.parametrize(
    "data",
    [
        {"reward": 0.0},
        {"reward": 1},
        {"reward": "0.5"},
        {"reward": 0.0, "mask_sample": True, "failure_kind": "session_lost", "failure_reason": "lost"},
        {"reward": 0.0, "mask_sample": 1},
        {"reward": 0.0, "mask_sample": "true"},
        {"reward": 0.0, "mask_sample": "off"},
        {"reward": 0.5, "failure_kind": "judge_unparseable"},
        {"reward": 0.0, "failure_kind": "Not A Kind"},
        {"reward": 0.0, "failure_reason": "x" * 5000},
        {"reward": 0.0, "extra": {"kept": "out"}},
        {"reward": "NaN please"},
        {"reward": None},
        {},
        {"reward": 0.0, "mask_sample": "maybe"},
        {"reward": 0.0, "failure_kind": 7},
        {"reward": 0.0, "failure_reason": 7},
    ],
)
def test_verify_fields_are_read_as_base_verify_response_reads_them(gym, data):
    try:
        released: Any = gym.BaseVerifyResponse.model_validate(data).model_dump(include=set(VERIFY_FIELDS))
    except ValidationError:
        released = "rejected"
    try:
        mine: Any = VerifyOutcome.from_response(data).model_dump()
    except ValueError:
        mine = "rejected"
    assert mine == released


def test_verify_outcome_is_read_from_a_released_response_object(gym):
    response = gym.BaseVerifyResponse(reward=0.0, mask_sample=True, failure_kind="session_lost")
    assert VerifyOutcome.from_response(response).model_dump() == response.model_dump(include=set(VERIFY_FIELDS))


def test_where_ng_otel_reads_more_than_base_verify_response_it_says_so(gym):
    # A top-level null (a subclass that redeclared the field sends one) is no answer: the older
    # instance_config.mask_sample decides. BaseVerifyResponse itself rejects the null and never
    # reads instance_config; NeMo-RL reads only instance_config.
    data = {"reward": 0.0, "mask_sample": None, "instance_config": {"mask_sample": True}}
    with pytest.raises(ValidationError):
        gym.BaseVerifyResponse.model_validate(data)
    assert VerifyOutcome.from_response(data).mask_sample is True
    older = {"reward": 0.0, "instance_config": {"mask_sample": True}}
    assert gym.BaseVerifyResponse.model_validate(older).mask_sample is False
    assert VerifyOutcome.from_response(older).mask_sample is True


class _VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    response: dict[str, Any]


def test_a_judge_failsafe_row_is_counted_masked_as_judge_failed(gym):
    async def verify(body: _VerifyRequest) -> None:
        raise gym.JudgeError("judge returned 503")

    request = _VerifyRequest(response={"output": []}, instance_config={"problem": 7})
    reply = asyncio.run(gym.judge_failsafe(verify)(body=request))
    row = json.loads(reply.body)
    assert row["mask_sample"] is True and row["instance_config"] == {"problem": 7, "mask_sample": True}
    assert VerifyOutcome.from_response(row).model_dump() == gym.BaseVerifyResponse.model_validate(row).model_dump(
        include=set(VERIFY_FIELDS)
    )
    with capture_failures() as telemetry:
        assert record_verify_outcome(row) is not None
    (point,) = telemetry.metric_points("ng.verify.outcomes")
    assert point["attributes"] == {"ng.verify.masked": True, "ng.failure.kind": "judge_failed"}
    (event,) = telemetry.failure_events()
    assert event["ng.failure.reason"] == "judge returned 503"


# --- the episode response -------------------------------------------------------------------

IDENTITY = {"episode_id": {"rollout_id": "task-1", "attempt": 0}, "task_id": {"taskset": "s", "task_id": "t"}}


def handled_response(**kwargs: Any) -> dict[str, Any]:
    with capture_failures():
        try:
            raise ConnectionResetError("sandbox connection reset by peer")
        except ConnectionResetError as err:
            handled_episode_failure("session_lost", "sandbox session lost", stage="agent", terminal=True, cause=err)
        handled_episode_failure("session_release_failed", "release failed", stage="cleanup", terminal=False)
        return episode_response(IDENTITY, **kwargs)


def test_the_episode_response_is_what_base_environment_server_writes_with_the_report_beside_it(gym):
    response = handled_response()
    body = {key: value for key, value in response.items() if key != "failure_report"}
    # What BaseEnvironmentServer.failure_response returns for the same failure.
    failure = gym.episode_types.EpisodeFailure(
        failure_reason="sandbox session lost", terminal=True, failure_kind="session_lost", stage="agent"
    )
    released = gym.episode_types.BaseEpisodeResponse.model_validate(
        {**IDENTITY, "failure": failure.model_dump(mode="json")}
    )
    assert json.loads(released.model_dump_json()) == body
    assert json.loads(gym.episode_types.BaseEpisodeResponse.model_validate(body).model_dump_json()) == body

    class MainEpisodeResponse(gym.episode_types.BaseEpisodeResponse):  # failure_report declared, as Gym Main documents
        failure_report: dict[str, Any] | None = None

    assert json.loads(MainEpisodeResponse.model_validate(response).model_dump_json()) == response
    with pytest.raises(ValidationError, match="failure_report"):  # 0.7.0's own model forbids it
        gym.episode_types.BaseEpisodeResponse.model_validate(response)
    bare = handled_response(with_report=False)
    assert json.loads(gym.episode_types.BaseEpisodeResponse.model_validate(bare).model_dump_json()) == bare


def test_a_result_with_a_failed_cleanup_stays_a_result_upstream_accepts(gym):
    with capture_failures():
        handled_episode_failure("session_release_failed", "release failed", stage="cleanup", terminal=False)
        response = episode_response({**IDENTITY, "result": {"reward": 1.0}}, with_report=False)
    assert gym.episode_types.BaseEpisodeResponse.model_validate(response).result == {"reward": 1.0}


# --- the vocabulary ---------------------------------------------------------------------------


def test_the_vocabulary_holds_every_released_name_and_says_which_it_adds(gym):
    released = gym.failure_kinds.FAILURE_KINDS
    assert released <= FAILURE_KINDS
    assert FAILURE_KINDS - released == {"environment_server_failed", "protocol_violation"}
    for name in released:
        assert getattr(kinds, name.upper()) == getattr(gym.failure_kinds, name.upper()) == name


@pytest.mark.parametrize(
    "name", ["session_lost", "browser_crashed", "browser:crashed", "a:b:c", "Bad Kind", "judge_failed\n", ""]
)
def test_lookup_and_warnings_agree_with_upstream(gym, name, caplog):
    assert is_registered(name) == gym.failure_kinds.is_registered(name)
    assert is_namespaced(name) == gym.failure_kinds.is_namespaced(name)
    kinds._warned.discard(name)
    gym.failure_kinds._WARNED_UNKNOWN.discard(name)
    with caplog.at_level(logging.WARNING):
        assert kinds.validate_failure_kind(name) == name
        mine = len(caplog.records)
        assert gym.failure_kinds.validate_failure_kind(name) == name
    assert mine == len(caplog.records) - mine
