"""A process whose Gym request loop (the 0.7.0 wheel's ``_request_with_retries``) runs out of
connection retries against an endpoint that drops every connection, and whose collection holds
a rollout that never answers, its metrics on a Prometheus endpoint. Driven by files in FOLDER:

    python exhaust.py FOLDER      # FOLDER/go-N: run phase N; writes FOLDER/done-N after it
"""

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

import ng_otel.otel as otel
from ng_otel.gym import deployment
from ng_otel.integrations.aiohttp import failure_trace_config
from ng_otel.otel import recovery
from tests.test_recovery import gym_server_utils

folder = Path(sys.argv[1])


async def wait_for(name: str) -> None:
    while not (folder / name).exists():
        await asyncio.sleep(0.1)


async def main() -> None:
    async def drop(request: web.Request) -> web.Response:
        request.transport.close()
        return web.Response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", drop)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/responses"
    async with aiohttp.ClientSession(trace_configs=[failure_trace_config()]) as session:
        module = gym_server_utils(session)
        for phase in (1, 2):
            await wait_for(f"go-{phase}")
            try:
                await module._request_with_retries("POST", url, json={}, _max_connection_retries=2)
            except aiohttp.ServerDisconnectedError:
                pass
            (folder / f"done-{phase}").write_text("")
        await wait_for("go-3")  # a rollout that never answers: stalled after a second
        loop = recovery.RetryLoop("collection")
        entry = recovery.in_flight().start(loop, stalled_after=1.0)
        await wait_for("go-4")  # it ends
        recovery.in_flight().end(entry)
        (folder / "done-4").write_text("")
        await wait_for("stop")
    await runner.cleanup()


otel.enable("recovery-exhaust")
deployment.install(deployment.GymProcess("simple_agent", "agent"))
asyncio.run(main())
time.sleep(0.1)
