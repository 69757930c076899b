"""The three Gym-shaped servers, wired with ng_otel exactly as the quickstart says:

    ng_otel.enable("model-server")
    FastAPIInstrumentor.instrument_app(app)     # optional: the server span and trace context
    app.add_middleware(FailureReportMiddleware)  # the one line that reports failures

Each request names a scenario, so the same stack shows every failure shape. ``serve.py``
runs one of them.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

import ng_otel
from ng_otel import NgFailureEvent, observe_failure
from ng_otel.gym.episodes import episode_response, handled_episode_failure
from ng_otel.integrations.aiohttp import failure_trace_config, raise_boundary_failure
from ng_otel.integrations.asgi import FailureReportMiddleware


class JudgeSdkError(Exception):
    """Stands in for a third-party judge SDK's error: a type, a message and a status."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


def new_app(service: str) -> FastAPI:
    ng_otel.enable(service)
    app = FastAPI()
    FastAPIInstrumentor.instrument_app(app)
    app.add_middleware(FailureReportMiddleware)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


# -- model server --------------------------------------------------------------------------


def model_app() -> FastAPI:
    app = new_app("model-server")

    @app.post("/v1/chat/completions")
    async def chat(body: dict[str, Any]) -> Response:
        scenario, attempt = body.get("scenario"), body.get("attempt", 0)
        if scenario == "model_timeout":
            try:
                raise TimeoutError("no bytes from the inference backend in 30s")
            except TimeoutError as err:
                raise NgFailureEvent(
                    "transport_timeout",
                    "inference backend did not answer within 30s",
                    boundary="model",
                    stage="agent",
                    http_status=504,
                    operation="chat_completions",
                ) from err
        if scenario == "retry_recovered" and attempt == 0:
            raise NgFailureEvent(
                "provider_unavailable",
                "all inference replicas busy",
                boundary="model",
                stage="agent",
                http_status=503,
                operation="chat_completions",
            )
        if scenario == "oversized":
            for replica in range(3):
                observe_failure(
                    NgFailureEvent(
                        "provider_unavailable",
                        f"replica {replica}: " + "busy " * 380,
                        boundary="model",
                        operation="chat_completions",
                    )
                )
            raise NgFailureEvent(
                "provider_quota_exhausted",
                "every replica refused: " + "quota " * 300,
                boundary="model",
                http_status=503,
                operation="chat_completions",
            )
        if scenario == "malformed_header":
            return JSONResponse(_completion(), headers={"X-NG-Failure-Report": '{"events": {"x": "\\r\\nnot a record'})
        return JSONResponse(_completion())

    return app


def _completion() -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": "42"}}]}


# -- resources server ----------------------------------------------------------------------


def resources_app() -> FastAPI:
    app = new_app("resources-server")

    async def call_judge(scenario: str) -> float:
        if scenario == "judge_failed":
            raise JudgeSdkError("429 Too Many Requests: judge rate limit reached", status_code=429)
        return 1.0

    @app.post("/episode")
    async def episode(body: dict[str, Any]) -> dict[str, Any]:
        """An environment step loop that handles its failures and returns them, answered in
        NeMo Gym 0.7.0's ``BaseEpisodeResponse`` shape."""
        response: dict[str, Any] = {
            "episode_id": {"rollout_id": str(body.get("scenario", "demo")), "attempt": 0},
            "task_id": {"taskset": "demo:episodes", "task_id": "0"},
            "result": {"trajectory": ["reset", "observe", "act"]},
        }
        if body.get("scenario") == "episode_lost":
            try:
                raise NgFailureEvent(
                    "transport_peer_drop", "sandbox connection reset by peer", boundary="environment", stage="agent"
                )
            except NgFailureEvent as err:
                handled_episode_failure(
                    "session_lost",
                    "sandbox session lost mid-episode",
                    stage="agent",
                    terminal=True,
                    partial={"steps_completed": 2},
                    cause=err,
                )
            # cleanup runs after the decision, and can fail too: a late observation
            handled_episode_failure(
                "session_release_failed", "could not release the sandbox", stage="cleanup", terminal=False
            )
        return episode_response(response)

    @app.post("/verify")
    async def verify(body: dict[str, Any]) -> dict[str, Any]:
        scenario = body.get("scenario", "ok")
        if scenario == "masked":
            return {
                "reward": 0.0,
                "mask_sample": True,
                "failure_kind": "session_lost",
                "failure_reason": "browser session lost before the final page could be read",
            }
        if scenario == "degraded":
            # Validly scored, but the judge needed a fallback parse: a kind, not a mask.
            return {
                "reward": 0.5,
                "mask_sample": False,
                "failure_kind": "judge_unparseable",
                "failure_reason": "judge reply needed the lenient parser",
            }
        if scenario == "hostile_verify":
            return {"reward": "not a number", "mask_sample": "maybe", "failure_reason": "x" * 100_000}
        if scenario == "foreign_between":
            try:
                try:
                    raise NgFailureEvent(
                        "session_lost",
                        "sandbox session expired mid-verification",
                        boundary="environment",
                        stage="verification",
                    )
                except NgFailureEvent as lost:
                    raise RuntimeError("sandbox client crashed while reading results") from lost
            except RuntimeError as crash:
                raise NgFailureEvent(
                    "verifier_error",
                    "verifier could not read the sandbox",
                    boundary="resources_server",
                    stage="verification",
                    http_status=500,
                    operation="verify",
                ) from crash
        try:
            reward = await call_judge(scenario)
        except JudgeSdkError as err:
            raise NgFailureEvent(
                "judge_failed",
                "judge call failed",
                boundary="resources_server",
                stage="verification",
                http_status=502,
                operation="verify",
            ) from err
        return {"reward": reward, "mask_sample": False}

    return app


# -- agent server (with its harness) -------------------------------------------------------


def agent_app(model_url: str, resources_url: str) -> FastAPI:
    app = new_app("agent-server")
    AioHttpClientInstrumentor().instrument()
    state: dict[str, aiohttp.ClientSession] = {}

    def session() -> aiohttp.ClientSession:
        if "session" not in state:
            state["session"] = aiohttp.ClientSession(trace_configs=[failure_trace_config(boundary="harness")])
        return state["session"]

    async def call_model(scenario: str, attempt: int) -> dict[str, Any]:
        async with session().post(
            f"{model_url}/v1/chat/completions", json={"scenario": scenario, "attempt": attempt}
        ) as response:
            await raise_boundary_failure(response)
            return await response.json()  # type: ignore[no-any-return]

    async def harness(scenario: str) -> dict[str, Any]:
        """Calls the model, retrying once; a failure it cannot recover is its own."""
        for attempt in range(2):
            try:
                return await call_model(scenario, attempt)
            except NgFailureEvent as err:
                if attempt == 0 and err.failure_kind == "provider_unavailable":
                    observe_failure(err)  # recovered by the retry below
                    continue
                raise NgFailureEvent(
                    "agent_run_error",
                    "harness: model call failed",
                    boundary="harness",
                    stage="agent",
                    operation="chat_completions",
                ) from err
            except aiohttp.ClientResponseError as err:
                raise NgFailureEvent(
                    "agent_run_error",
                    "harness: model reply unusable",
                    boundary="harness",
                    stage="agent",
                    operation="chat_completions",
                ) from err
        raise AssertionError("unreachable")

    async def verify(scenario: str) -> dict[str, Any]:
        async with session().post(f"{resources_url}/verify", json={"scenario": scenario}) as response:
            await raise_boundary_failure(response)
            return await response.json()  # type: ignore[no-any-return]

    @app.post("/run")
    async def run(body: dict[str, Any]) -> dict[str, Any]:
        scenario = body.get("scenario", "ok")
        try:
            completion = await harness(scenario)
        except NgFailureEvent as err:
            raise NgFailureEvent(
                "agent_run_error",
                "rollout failed in the agent loop",
                boundary="agent",
                stage="agent",
                http_status=500,
                operation="run",
            ) from err
        try:
            outcome = await verify(scenario)
        except NgFailureEvent as err:
            raise NgFailureEvent(
                "agent_run_error",
                "rollout failed in verification",
                boundary="agent",
                stage="verification",
                http_status=500,
                operation="run",
            ) from err
        return {"response": completion["choices"][0]["message"]["content"], **outcome}

    @app.on_event("shutdown")
    async def close() -> None:
        if "session" in state:
            await state["session"].close()

    return app
