"""The Ray lane's driver: a local Ray cluster whose actors call a Gym-shaped server that fails.

Each scenario runs under a driver span of its own and records the driver's failure from what
``ray.get`` raised, as a NeMo-RL-style training loop would. What the driver saw is written to
``OUT/driver.json`` for ``tests/test_ray.py``; the telemetry goes to the lane's receiver.

    python driver.py SERVER_URL OUT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import ray
from opentelemetry import trace

import ng_otel
from ng_otel.integrations import ray as ng_ray
from ng_otel.integrations.aiohttp import failure_trace_config, raise_boundary_failure
from ng_otel.otel.providers import shutdown

SERVER = sys.argv[1]
OUT = Path(sys.argv[2])
RESTART_TIMEOUT = 60.0  # how long Ray may take to bring a killed actor back
DEATH_TIMEOUT = 30.0  # how long a terminated actor may take to be reported dead
POLL = 0.2
STATUSES = (503, 429, 400)  # what the Gym-shaped server answers: INFRA, INFRA (retriable 4xx), DATA
MODES = ("boundary", "typed", "foreign")
ACTOR_BOUNDARY = "collection"  # the actor runs Gym's rollout collection, as NeMo-RL's NemoGym does


async def call_gym(status: int, mode: str = "boundary") -> None:
    """What Gym's client does in the actor: the callee's failure, rebuilt with its ids
    (``boundary``), or aiohttp's ``ClientResponseError`` (``foreign``)."""
    async with aiohttp.ClientSession(trace_configs=[failure_trace_config(boundary=ACTOR_BOUNDARY)]) as session:
        async with session.post(f"{SERVER}/run", json={"status": status}) as response:
            if mode == "foreign":
                response.raise_for_status()
            await raise_boundary_failure(response, boundary=ACTOR_BOUNDARY)


@ray.remote
class GymActor:
    """NeMo-RL's ``NemoGym`` actor in miniature: async methods that call Gym over aiohttp."""

    async def run(self, status: int, mode: str) -> None:
        """``boundary``: raise what ``raise_boundary_failure`` gave; ``typed``: a typed failure
        ``from None``, as NeMo-RL does; ``foreign``: one raised from aiohttp's error."""
        try:
            await call_gym(status, mode)
        except aiohttp.ClientResponseError as error:
            raise ng_otel.NgFailureEvent(
                "agent_request_failed", "Gym /run failed", boundary=ACTOR_BOUNDARY, http_status=error.status
            ) from error  # its headers do not pickle; its type, message and status cross as foreign_error
        except ng_otel.NgFailureEvent:
            if mode != "typed":
                raise
            # NeMo-RL's _typed_gym_failure: a typed failure `from None`, here an ng_otel event.
            raise ng_otel.NgFailureEvent(
                "agent_request_failed",
                f"NeMo-Gym /run failed with HTTP {status} (pid {os.getpid()})",
                boundary=ACTOR_BOUNDARY,
                http_status=status,
            ) from None

    async def observe(self) -> str:
        """A recovered failure this actor records and keeps: nothing crosses for it."""
        event = ng_otel.NgFailureEvent("transport_peer_drop", f"retried (pid {os.getpid()})", boundary=ACTOR_BOUNDARY)
        ng_otel.observe_failure(event)
        return event.event_id

    def pid(self) -> int:
        return os.getpid()


@ray.remote
def gym_task(status: int) -> None:
    asyncio.run(call_gym(status))


def rollout(name: str, call: Any) -> dict[str, Any]:
    """``ray.get(call())`` under a driver span; the driver's own failure from what it raised."""
    with trace.get_tracer("ray-lane").start_as_current_span(f"rollout {name}") as span:
        context = span.get_span_context()
        seen: dict[str, Any] = {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
        try:
            ray.get(call())
        except Exception as error:
            crossed = ng_otel.find_boundary_failure(error)
            seen["raised"] = type(error).__name__
            seen["crossed_id"] = getattr(crossed, "event_id", None)
            seen["crossed_status"] = getattr(crossed, "http_status", None)
            foreign = getattr(crossed, "foreign_error", None)
            seen["crossed_foreign"] = foreign.to_record() if foreign is not None else None
            failure_class = ng_ray.failure_class(error)
            seen["class"] = failure_class.value if failure_class is not None else None
            failure = ng_otel.NgFailureEvent("agent_request_failed", f"rollout {name} failed", boundary="harness")
            try:
                raise failure from error
            except ng_otel.NgFailureEvent:
                ng_otel.record_failure(failure)
            seen["driver_id"] = failure.event_id
        return seen


def wait_until(check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(POLL)
    raise TimeoutError(f"not within {timeout} s")


def main() -> None:
    ng_otel.enable("ray-driver")
    ng_ray.instrument()
    started = time.monotonic()
    ray.init(
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": "ng_otel.integrations.ray.setup_worker"},
    )
    seen: dict[str, Any] = {"ray_start_seconds": round(time.monotonic() - started, 1)}

    actor = GymActor.remote()
    for status in STATUSES:
        for mode in MODES:
            seen[f"{mode}_{status}"] = rollout(f"{mode} {status}", lambda m=mode, s=status: actor.run.remote(s, m))
    seen["task_503"] = rollout("task 503", lambda: gym_task.remote(503))

    # Restarted by Ray: each incarnation's crossed failure is exported once, by it.
    restarted = GymActor.options(max_restarts=1).remote()
    first_pid = ray.get(restarted.pid.remote())
    seen["restart_before"] = rollout("restart before", lambda: restarted.run.remote(503, "typed"))
    ray.kill(restarted, no_restart=False)
    second_pid = wait_until(lambda: (pid := ray.get(restarted.pid.remote())) != first_pid and pid, RESTART_TIMEOUT)
    seen["restart_after"] = rollout("restart after", lambda: restarted.run.remote(503, "typed"))
    seen["restart_pids"] = [first_pid, second_pid]

    # Killed outright: what crossed was flushed first; what the actor still held is lost.
    killed = GymActor.remote()
    seen["kill_crossed"] = rollout("kill crossed", lambda: killed.run.remote(503, "typed"))
    seen["kill_held_id"] = ray.get(killed.observe.remote())
    ray.kill(killed)

    # Exits gracefully: what it held is flushed before the process ends.
    leaving = GymActor.remote()
    seen["exit_held_id"] = ray.get(leaving.observe.remote())
    leaving.__ray_terminate__.remote()
    wait_until(lambda: _dead(leaving), DEATH_TIMEOUT)

    ray.shutdown()
    shutdown()
    (OUT / "driver.json").write_text(json.dumps(seen, indent=2))


def _dead(actor: Any) -> bool:
    try:
        ray.get(actor.pid.remote(), timeout=DEATH_TIMEOUT)
    except ray.exceptions.RayActorError:
        return True
    return False


if __name__ == "__main__":
    main()
