"""A collection run's saved rows, both formats mixed, with the exact figures they hold.

``write_mixed_rows(path, count)`` writes ``count`` rows that cycle through Gym Main's saved
reports (chains, a recovered retry, a judge failure, an omitted report, a namespaced kind),
NeMo Gym 0.7.0's failure sidecar rows and judge rows, healthy and masked rows, and a few lines
that are not rows (truncated, invalid UTF-8, not JSON). It returns what ``ng-otel summary
--json`` must say about the file, counted here from the templates by hand, never by ng_otel,
so a test can hold the command to it. ``tests/test_summary.py`` uses it with a small count,
``bench/summary.py`` with 50,000.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

PAD = "The quick brown fox jumps over the lazy dog. " * 14  # a row's prompt and answer: ~1 KB a row
BAD_EVERY = 5_000  # one line that is not a row per this many rows, rotating through BAD_LINES
BAD_LINES = (
    b'{"scenario": "cut off", "_ng_failure_events": {"',  # truncated mid-write
    b'{"output": "\xff\xfe not utf-8"}',  # invalid UTF-8
    b"this is not json",
)


def _event(
    event_id: str, boundary: str, kind: str, *, status: int | None = None, cause: str | None = None, **extra: Any
) -> dict[str, Any]:
    record: dict[str, Any] = {"event_id": event_id, "boundary": boundary, "failure_kind": kind}
    record["failure_reason"] = f"{kind} at the {boundary}"
    if status is not None:
        record["http_status"] = status
    if cause is not None:
        record["cause_id"] = cause
    record.update(extra)
    return record


def _ids(index: int, count: int) -> list[str]:
    return [f"{index:016x}{slot:016x}" for slot in range(count)]


def _model_timeout(i: int) -> dict[str, Any]:
    agent, harness, model = _ids(i, 3)
    return {
        "_ng_failure_id": agent,
        "_ng_failure_events": {
            agent: _event(agent, "agent", "agent_run_error", status=500, cause=harness),
            harness: _event(harness, "harness", "agent_run_error", cause=model, stage="agent"),
            model: _event(model, "model", "transport_timeout", status=504, stage="agent"),
        },
        "_ng_failure_contexts": {agent: f"{i:032x}-{1:016x}"},
    }


def _retry_recovered(i: int) -> dict[str, Any]:
    (drop,) = _ids(i, 1)
    return {"reward": 1.0, "_ng_failure_events": {drop: _event(drop, "model", "transport_peer_drop", status=502)}}


def _judge_main(i: int) -> dict[str, Any]:
    (judge,) = _ids(i, 1)
    event = _event(judge, "resources_server", "judge_failed", stage="verification")
    return {"reward": 0.0, "mask_sample": True, "_ng_failure_id": judge, "_ng_failure_events": {judge: event}}


def _omitted(i: int) -> dict[str, Any]:
    return {"status": 500, "_ng_failure_events_omitted": True}


def _namespaced(i: int) -> dict[str, Any]:
    agent, env = _ids(i, 2)
    foreign = {"type": "sandbox.PatchError", "message": "hunk 2 failed"}
    return {
        "_ng_failure_id": agent,
        "_ng_failure_events": {
            agent: _event(agent, "agent", "agent_run_error", status=500, cause=env),
            env: _event(env, "environment", "swe:patch_failed", status=422, foreign_error=foreign),
        },
    }


def _sidecar_unreachable(i: int) -> dict[str, Any]:
    return {
        "_ng_task_index": i,
        "_ng_rollout_index": 0,
        "_ng_failure_class": "agent_request_failed",
        "_ng_failure_type": "ClientConnectorError",
        "_ng_failure_message": "Cannot connect to host 127.0.0.1:9 ssl:default [Connection refused]",
        "_ng_failure_http_status": None,
        "_ng_failure_response_body": None,
    }


def _sidecar_run_error(i: int) -> dict[str, Any]:
    return {
        "_ng_task_index": i,
        "_ng_rollout_index": 1,
        "_ng_failure_class": "agent_run_error",
        "_ng_failure_type": "ClientResponseError",
        "_ng_failure_message": "500, message='Internal Server Error'",
        "_ng_failure_http_status": 500,
        "_ng_failure_response_body": '"internal error"',
    }


def _sidecar_terminal(i: int) -> dict[str, Any]:
    return {
        "_ng_task_id": f"task-{i}",
        "_ng_failure_class": "environment_server_failed",
        "_ng_failure_terminal": True,
        "_ng_failure_message": "sandbox never became ready",
        "_ng_failure_stage": "seed",
    }


def _judge_070(i: int) -> dict[str, Any]:
    return {
        "_ng_task_index": i,
        "_ng_rollout_index": 0,
        "reward": 0.0,
        "mask_sample": True,
        "failure_kind": "judge_failed",
        "failure_reason": "ClientResponseError: 503, message='Service Unavailable'",
        "instance_config": {"mask_sample": True},
        "_ng_failure_class": "judge_failed",
        "_ng_failure_judge_error": "ClientResponseError: 503, message='Service Unavailable'",
    }


def _healthy(i: int) -> dict[str, Any]:
    return {"reward": 1.0, "mask_sample": False}


def _masked_older(i: int) -> dict[str, Any]:
    return {"reward": 0.0, "instance_config": {"mask_sample": True}}


# What each row holds: "events" as (kind, boundary, class) each; "root" the kind at the root of
# the row's own failure chain (None when the row has no failure id); "masked" whether the
# sample is masked.
FACTS: dict[Any, dict[str, Any]] = {
    _healthy: {"events": [], "root": None, "masked": False},
    _model_timeout: {
        "events": [
            ("agent_run_error", "agent", "infra"),
            ("agent_run_error", "harness", "data"),
            ("transport_timeout", "model", "infra"),
        ],
        "root": "transport_timeout",
        "masked": False,
    },
    _retry_recovered: {"events": [("transport_peer_drop", "model", "infra")], "root": None, "masked": False},
    _judge_main: {"events": [("judge_failed", "resources_server", "infra")], "root": "judge_failed", "masked": True},
    _omitted: {"events": [], "root": None, "masked": False},
    _namespaced: {
        "events": [("agent_run_error", "agent", "infra"), ("swe:patch_failed", "environment", "data")],
        "root": "swe:patch_failed",
        "masked": False,
    },
    _sidecar_unreachable: {
        "events": [("agent_request_failed", "collection", "infra")],
        "root": "agent_request_failed",
        "masked": False,
    },
    _sidecar_run_error: {
        "events": [("agent_run_error", "collection", "infra")],
        "root": "agent_run_error",
        "masked": False,
    },
    _sidecar_terminal: {  # terminal: DATA whatever the kind
        "events": [("environment_server_failed", "environment", "data")],
        "root": "environment_server_failed",
        "masked": False,
    },
    _judge_070: {"events": [("judge_failed", "resources_server", "infra")], "root": "judge_failed", "masked": True},
    _masked_older: {"events": [], "root": None, "masked": True},
}
# The chain is the common case: ~1.6 events a row, as in a real run's file.
CYCLE = [
    _healthy,
    _model_timeout,
    _retry_recovered,
    _model_timeout,
    _judge_main,
    _omitted,
    _namespaced,
    _model_timeout,
    _sidecar_unreachable,
    _sidecar_run_error,
    _sidecar_terminal,
    _judge_070,
    _model_timeout,
    _masked_older,
    _namespaced,
    _model_timeout,
    _model_timeout,
]


def write_mixed_rows(path: Path, count: int, *, bad_every: int = BAD_EVERY) -> dict[str, Any]:
    """Write ``count`` rows (plus one bad line per ``bad_every``) to ``path``; return the
    figures ``ng-otel summary --json`` must give for it."""
    import orjson

    rows = failed = events = masked = skipped = 0
    by_kind: Counter[str] = Counter()
    by_boundary: Counter[str] = Counter()
    by_class: Counter[str] = Counter()
    root_kinds: Counter[str] = Counter()
    with path.open("wb") as out:
        for index in range(count):
            if index and index % bad_every == 0:
                out.write(BAD_LINES[(index // bad_every) % len(BAD_LINES)] + b"\n")
                skipped += 1
            make = CYCLE[index % len(CYCLE)]
            row = {"task": index, "prompt": PAD, **make(index)}
            out.write(orjson.dumps(row) + b"\n")
            facts = FACTS[make]
            rows += 1
            events += len(facts["events"])
            for kind, boundary, klass in facts["events"]:
                by_kind[kind] += 1
                by_boundary[boundary] += 1
                by_class[klass] += 1
            if facts["root"] is not None:
                failed += 1
                root_kinds[facts["root"]] += 1
            masked += facts["masked"]
    return {
        "rows": rows,
        "failed_rows": failed,
        "events": events,
        "by_kind": dict(by_kind),
        "by_boundary": dict(by_boundary),
        "by_class": dict(by_class),
        "root_kinds": dict(root_kinds),
        "masked": masked,
        "skipped": skipped,
    }


if __name__ == "__main__":
    import json
    import sys

    target = Path(sys.argv[1])
    print(json.dumps(write_mixed_rows(target, int(sys.argv[2]) if len(sys.argv) > 2 else 50_000), indent=1))
