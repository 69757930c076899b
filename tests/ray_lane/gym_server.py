"""A Gym-shaped server for the Ray lane, served as Gym serves its own: FastAPI on uvicorn, with
OpenTelemetry's FastAPI instrumentation (the server span, joined to the caller's trace) and
ng_otel's layers. ``POST /run`` fails as a Gym agent whose policy model failed, with the status
the request names; ng_otel records the chain on the server span and reports it on the reply.

    python gym_server.py PORT
"""

from __future__ import annotations

import sys

import uvicorn
from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

import ng_otel
from ng_otel.integrations import instrument_app

app = FastAPI()


@app.post("/run")
async def run(body: dict[str, int]) -> None:
    try:
        raise ng_otel.NgFailureEvent("provider_unavailable", "backend overloaded", boundary="model")
    except ng_otel.NgFailureEvent as model_failure:
        raise ng_otel.NgFailureEvent(
            "agent_run_error", "the policy model failed", boundary="agent", http_status=body["status"]
        ) from model_failure


@app.get("/ready")
async def ready() -> str:
    return "ok"


if __name__ == "__main__":
    ng_otel.enable("gym-server")
    FastAPIInstrumentor.instrument_app(app, exclude_spans=["send", "receive"])
    instrument_app(app)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
