"""Rollout collection: run each scenario through the agent and save one row per rollout with
the failures its reply reported (the `_ng_failure_*` keys)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from opentelemetry import trace

import ng_otel
from ng_otel.gym.collection import report_row
from ng_otel.integrations.aiohttp import failure_trace_config, reply_report

SCENARIOS = (
    "model_timeout",
    "retry_recovered",
    "judge_failed",
    "masked",
    "oversized",
    "foreign_between",
    "malformed_header",
    "ok",
)


async def collect(agent_url: str, scenarios: tuple[str, ...] = SCENARIOS, concurrency: int = 1) -> list[dict[str, Any]]:
    """One row per scenario, in order; up to ``concurrency`` rollouts in flight at once."""
    ng_otel.enable("rollout-collection")
    tracer = trace.get_tracer("gym.collection")
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(
        connector=connector, trace_configs=[failure_trace_config(boundary="collection")]
    ) as session:

        async def rollout(scenario: str) -> dict[str, Any]:
            async with gate:
                with tracer.start_as_current_span(f"rollout {scenario}") as span:
                    async with session.post(f"{agent_url}/run", json={"scenario": scenario}) as response:
                        body = await response.json(content_type=None)
                        status = response.status
                        carried = "X-NG-Failure-Report" in response.headers
                        report = reply_report(response, boundary="collection")
                    trace_id = f"{span.get_span_context().trace_id:032x}"
            # As Gym's collection saves a rollout: the verify reply's keys (reward, mask_sample)
            # at the top of the row, where ng-otel summary reads them.
            row: dict[str, Any] = body if status < 400 and isinstance(body, dict) else {"error": body}
            row.update(scenario=scenario, status=status, trace_id=trace_id, report_header=carried)
            return {**row, **report_row(report)}

        return list(await asyncio.gather(*(rollout(scenario) for scenario in scenarios)))


def run(agent_url: str, scenarios: tuple[str, ...] = SCENARIOS, concurrency: int = 1) -> list[dict[str, Any]]:
    return asyncio.run(collect(agent_url, scenarios, concurrency))


def main() -> None:
    import argparse
    import json

    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

    from ng_otel.otel.providers import shutdown

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agent-url", required=True)
    parser.add_argument("--out", required=True, help="JSON lines, one row per rollout")
    parser.add_argument("--scenario", action="append", help="run only these (repeatable)")
    parser.add_argument("--repeat", type=int, default=1, help="run the scenarios this many times")
    parser.add_argument("--concurrency", type=int, default=1, help="rollouts in flight at once")
    args = parser.parse_args()
    AioHttpClientInstrumentor().instrument()
    rows = run(args.agent_url, tuple(args.scenario or SCENARIOS) * args.repeat, args.concurrency)
    with open(args.out, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    shutdown()


if __name__ == "__main__":
    main()
