"""Failures in saved rollout rows, in both formats Gym writes.

Gym Main saves each reply's report beside its row (``_ng_failure_events``,
``_ng_failure_id``, ``_ng_failure_events_omitted``). NeMo Gym 0.7.0, what users run today,
saves no events: its rollout collection writes each failed attempt to a
``<stem>_failures.jsonl`` sidecar with ``_ng_failure_class`` and evidence keys; a judge
failure's row (``judge_failsafe``'s masked verify reply, with ``mask_sample`` and
``_ng_failure_judge_error``) is routed there too (``nemo_gym/rollout_collection.py`` and
``nemo_gym/judge.py``). ``row_report`` reads either format as a ``FailureReport``, wherever
the row is; a 0.7.0 row becomes one event whose kind is its class. Every row key ng_otel
reads is named here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

import orjson

from ng_otel.contract.events import MAX_REASON_CHARS, MAX_TYPE_CHARS, STAGES, bound_text
from ng_otel.contract.kinds import is_well_formed
from ng_otel.contract.records import ROW_EVENTS, ROW_FAILURE_ID, ROW_OMITTED
from ng_otel.contract.report import FailureReport

# NeMo Gym 0.7.0's failure keys (nemo_gym/rollout_collection.py, nemo_gym/judge.py).
ROW_FAILURE_CLASS: Final = "_ng_failure_class"
ROW_FAILURE_TYPE: Final = "_ng_failure_type"
ROW_FAILURE_MESSAGE: Final = "_ng_failure_message"
ROW_FAILURE_HTTP_STATUS: Final = "_ng_failure_http_status"
ROW_FAILURE_RESPONSE_BODY: Final = "_ng_failure_response_body"
ROW_FAILURE_TERMINAL: Final = "_ng_failure_terminal"
ROW_FAILURE_STAGE: Final = "_ng_failure_stage"
ROW_JUDGE_ERROR: Final = "_ng_failure_judge_error"
ROW_TASK_INDEX: Final = "_ng_task_index"
ROW_ROLLOUT_INDEX: Final = "_ng_rollout_index"
ROW_TASK_ID: Final = "_ng_task_id"
ROW_MASK_SAMPLE: Final = "mask_sample"

ENVIRONMENT_SERVER_FAILED: Final = "environment_server_failed"
"""The class 0.7.0 collection gives an environment server's own reported failure."""
NO_REASON: Final = "no failure message was saved with this row"


def row_report(row: Mapping[str, Any]) -> FailureReport | None:
    """The failures a saved row holds, or ``None`` for a row without any (a success, an old
    row). Gym Main's saved report wins when a row has both formats. Raises ``ValueError``
    naming what is wrong."""
    if not isinstance(row, Mapping):
        raise ValueError("row: must be a JSON object")
    if ROW_EVENTS in row or ROW_FAILURE_ID in row or ROW_OMITTED in row:
        return _saved_report(row)
    if ROW_FAILURE_CLASS in row:
        return _class_report(row)
    return None


def row_terminal(row: Mapping[str, Any]) -> bool | None:
    """0.7.0's ``_ng_failure_terminal``: the failure must not be retried on resume."""
    value = row.get(ROW_FAILURE_TERMINAL)
    return value if isinstance(value, bool) else None


def _saved_report(row: Mapping[str, Any]) -> FailureReport:
    omitted = row.get(ROW_OMITTED, False)
    if not isinstance(omitted, bool):
        raise ValueError(f"{ROW_OMITTED}: must be a boolean")
    data: dict[str, Any] = {"events": row.get(ROW_EVENTS, {}), "omitted": omitted}
    if row.get(ROW_FAILURE_ID) is not None:
        data["failure_id"] = row[ROW_FAILURE_ID]
    return FailureReport.from_dict(data)


def _class_report(row: Mapping[str, Any]) -> FailureReport:
    kind = row[ROW_FAILURE_CLASS]
    if not is_well_formed(kind):
        raise ValueError(f"{ROW_FAILURE_CLASS}: not a failure kind (<domain>_<condition> or <server>:<kind>)")
    judged = ROW_JUDGE_ERROR in row  # judge_failsafe's verify reply, kept in the main rows
    # Collection saw the failure, unless the row says who did: the environment server's own
    # reported failure, or the resources server's judge.
    boundary = "resources_server" if judged else "environment" if kind == ENVIRONMENT_SERVER_FAILED else "collection"
    record: dict[str, Any] = {
        "event_id": _row_event_id(row),
        "boundary": boundary,
        "failure_kind": kind,
        "failure_reason": bound_text(_reason(row, judged)),
    }
    stage = row.get(ROW_FAILURE_STAGE) if not judged else "verification"
    if stage in STAGES:
        record["stage"] = stage
    status = row.get(ROW_FAILURE_HTTP_STATUS)
    if type(status) is int and 100 <= status <= 599:
        record["http_status"] = status
    foreign_type = row.get(ROW_FAILURE_TYPE)
    if isinstance(foreign_type, str) and foreign_type:
        foreign: dict[str, Any] = {
            "type": foreign_type[:MAX_TYPE_CHARS],
            "message": bound_text(_text(row.get(ROW_FAILURE_MESSAGE))),
        }
        if "http_status" in record:
            foreign["http_status"] = record["http_status"]
        record["foreign_error"] = foreign
    return FailureReport.from_dict({"events": {record["event_id"]: record}, "failure_id": record["event_id"]})


def _reason(row: Mapping[str, Any], judged: bool) -> str:
    keys = (ROW_JUDGE_ERROR, "failure_reason", ROW_FAILURE_MESSAGE) if judged else (ROW_FAILURE_MESSAGE,)
    for key in keys:
        text = _text(row.get(key))
        if text:
            return text
    return NO_REASON


def _text(value: object) -> str:
    return value[: MAX_REASON_CHARS * 2] if isinstance(value, str) else ""


def _row_event_id(row: Mapping[str, Any]) -> str:
    # 0.7.0 saved no event id: one derived from the row's content names the same failure the
    # same way every time it is read, so a replayed row is never recorded twice.
    try:
        canonical = orjson.dumps(row, option=orjson.OPT_SORT_KEYS, default=repr)
    except TypeError:  # an integer past 64 bits, say: the standard library writes any JSON value
        canonical = json.dumps(row, sort_keys=True, default=repr).encode()
    return hashlib.sha256(canonical).hexdigest()[:32]
