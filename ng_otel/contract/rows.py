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
from typing import Any, Final, NamedTuple

import orjson
from pydantic import TypeAdapter, ValidationError

from ng_otel.contract.events import (
    BOUNDARIES,
    EVENT_ID_RE,
    MAX_ID_CHARS,
    MAX_REASON_CHARS,
    MAX_TYPE_CHARS,
    OPERATION_RE,
    RECORD_ADAPTER,
    REQUIRED_RECORD_KEYS,
    STAGES,
    FailureRecord,
    ForeignErrorRecord,
    bound_text,
    is_http_status,
)
from ng_otel.contract.inner_errors import ROW_FAILURE_RESPONSE_BODY as ROW_FAILURE_RESPONSE_BODY
from ng_otel.contract.inner_errors import (
    body_names_servers,
    parse_inner_error,
    row_chain_records,
    row_server_boundaries,
)
from ng_otel.contract.kinds import (
    ENVIRONMENT_SERVER_FAILED,
    FAILURE_KINDS,
    is_namespaced,
    is_well_formed,
    validate_failure_kind,
)
from ng_otel.contract.records import ROW_EVENTS, ROW_FAILURE_ID, ROW_OMITTED
from ng_otel.contract.report import MAX_REPORT_EVENTS, FailureReport
from ng_otel.contract.report import _check_acyclic as check_acyclic

# NeMo Gym 0.7.0's failure keys (nemo_gym/rollout_collection.py, nemo_gym/judge.py).
ROW_FAILURE_CLASS: Final = "_ng_failure_class"
ROW_FAILURE_TYPE: Final = "_ng_failure_type"
ROW_FAILURE_MESSAGE: Final = "_ng_failure_message"
ROW_FAILURE_HTTP_STATUS: Final = "_ng_failure_http_status"
ROW_FAILURE_TERMINAL: Final = "_ng_failure_terminal"
ROW_FAILURE_STAGE: Final = "_ng_failure_stage"
ROW_JUDGE_ERROR: Final = "_ng_failure_judge_error"
ROW_TASK_INDEX: Final = "_ng_task_index"
ROW_ROLLOUT_INDEX: Final = "_ng_rollout_index"
ROW_TASK_ID: Final = "_ng_task_id"
ROW_MASK_SAMPLE: Final = "mask_sample"

NO_REASON: Final = "no failure message was saved with this row"


def row_report(row: Mapping[str, Any]) -> FailureReport | None:
    """The failures a saved row holds, or ``None`` for a row without any (a success, an old
    row). Gym Main's saved report wins when a row has both formats; a 0.7.0 row is the chain
    its nested error body holds (``row_failures``). Raises ``ValueError`` naming what is wrong."""
    return row_failures(row).report


class RowFailures(NamedTuple):
    """A row's failures and, where the row names them, the server that saw each."""

    report: FailureReport | None
    servers: Mapping[str, str]  # event id -> server name (a 0.7.0 row's body names them; Main's rows none)


_NO_SERVERS: Final[Mapping[str, str]] = {}


def _servers_along(row: Mapping[str, Any], report: FailureReport) -> Mapping[str, str]:
    """The servers a row's nested error body names, given to its saved report's chain (what
    ng_otel's collection hook saves beside a 0.7.0 row) cause by cause below the reply's own
    failure, where every boundary agrees; none where any does not (not the same chain)."""
    if report.failure_id is None or not body_names_servers(row):
        return _NO_SERVERS
    body = row[ROW_FAILURE_RESPONSE_BODY]
    hops = parse_inner_error(body, server_boundaries=row_server_boundaries(row)).hops
    named: dict[str, str] = {}
    for record, hop in zip(report.chain()[1:], hops, strict=False):  # a chain cut short names what it holds
        if hop.boundary != record["boundary"]:
            return _NO_SERVERS
        named[record["event_id"]] = hop.server
    return named


def row_failures(row: Mapping[str, Any]) -> RowFailures:
    """``row_report`` with the servers: a 0.7.0 failure row is collection's event caused by
    one event per server its ``_ng_failure_response_body`` names ("Hit an exception in
    <Class>___<server> calling an inner server: b'...'", read by ``inner_errors``), the
    provider's own message the root's reason. Raises ``ValueError`` naming what is wrong."""
    if not isinstance(row, Mapping):
        raise ValueError("row: must be a JSON object")
    if has_saved_report(row):
        report = _saved_report(row)
        return RowFailures(report, _servers_along(row, report))
    failure = class_row_failure(row)
    if failure is None:
        return RowFailures(None, _NO_SERVERS)
    chain = row_chain_records(row, _class_record(row, failure))
    top = chain.records[0]["event_id"]
    # Valid by construction: a well-formed kind, a fixed boundary, bounded text, a stage and a
    # status checked by class_row_failure, 32-hex ids; the inner records are bounded likewise.
    report = FailureReport._trusted({record["event_id"]: record for record in chain.records}, top)
    return RowFailures(report, chain.server_by_event())


def has_saved_report(row: Mapping[str, Any]) -> bool:
    """Whether the row holds Gym Main's saved report (which wins over 0.7.0's keys)."""
    return ROW_EVENTS in row or ROW_FAILURE_ID in row or ROW_OMITTED in row


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


class ClassRowFailure(NamedTuple):
    """The one failure of a NeMo Gym 0.7.0 failure row, without the event id ``row_report``
    derives for it (what counting needs, at a fraction of the cost)."""

    kind: str
    boundary: str
    stage: str | None
    http_status: int | None
    judged: bool  # judge_failsafe's verify reply


def class_row_failure(row: Mapping[str, Any]) -> ClassRowFailure | None:
    """The failure of a 0.7.0 row (``_ng_failure_class``, and no saved report, which would
    win), or ``None`` for any other row. Raises ``ValueError`` for a class that is no kind."""
    if ROW_FAILURE_CLASS not in row or has_saved_report(row):
        return None
    kind = row[ROW_FAILURE_CLASS]
    if not (type(kind) is str and kind in FAILURE_KINDS) and not is_well_formed(kind):  # registered: well-formed
        raise ValueError(f"{ROW_FAILURE_CLASS}: not a failure kind (<domain>_<condition> or <server>:<kind>)")
    validate_failure_kind(kind)  # warns once for an unregistered kind
    judged = ROW_JUDGE_ERROR in row  # judge_failsafe's verify reply, kept in the main rows
    # Collection saw the failure, unless the row says who did: the environment server's own
    # reported failure, or the resources server's judge.
    boundary = "resources_server" if judged else "environment" if kind == ENVIRONMENT_SERVER_FAILED else "collection"
    stage = row.get(ROW_FAILURE_STAGE) if not judged else "verification"
    status = row.get(ROW_FAILURE_HTTP_STATUS)
    return ClassRowFailure(
        kind,
        boundary,
        stage if stage in STAGES else None,
        status if is_http_status(status) else None,
        judged,
    )


def _class_record(row: Mapping[str, Any], failure: ClassRowFailure) -> dict[str, Any]:
    kind = failure.kind
    record: dict[str, Any] = {
        "event_id": _row_event_id(row),
        "boundary": failure.boundary,
        "failure_kind": kind,
        "failure_reason": bound_text(_reason(row, failure.judged)),
    }
    if failure.stage is not None:
        record["stage"] = failure.stage
    if failure.http_status is not None:
        record["http_status"] = failure.http_status
    foreign_type = row.get(ROW_FAILURE_TYPE)
    if isinstance(foreign_type, str) and foreign_type:
        foreign: dict[str, Any] = {
            "type": foreign_type[:MAX_TYPE_CHARS],
            "message": bound_text(_text(row.get(ROW_FAILURE_MESSAGE))),
        }
        if "http_status" in record:
            foreign["http_status"] = record["http_status"]
        record["foreign_error"] = foreign
    return record


def class_row_reason(row: Mapping[str, Any], failure: ClassRowFailure) -> str:
    """The reason of a 0.7.0 row's own failure, unbounded by the event's bound (what its
    record's ``failure_reason`` is cut from)."""
    return _reason(row, failure.judged)


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
    except TypeError:  # an integer past 64 bits, or nesting past orjson's 255 levels
        canonical = _sorted_json(row).encode()
    return hashlib.sha256(canonical).hexdigest()[:32]


class _Written(str):
    """JSON text already written, queued between the values still to write."""


def _sorted_json(value: Any) -> str:
    """``json.dumps(value, sort_keys=True, default=repr)``, written without recursion: a row
    orjson reads may nest 1,024 levels, deeper than ``json.dumps`` can follow."""
    parts: list[str] = []
    pending: list[Any] = [value]  # a stack: the next value to write is on top
    while pending:
        item = pending.pop()
        if type(item) is _Written:
            parts.append(item)
        elif isinstance(item, dict):
            pending.append(_Written("}"))
            for index, (key, member) in enumerate(_sorted_members(item)):
                pending += (member, _Written(_json_key(key) + ": "))
                if index < len(item) - 1:
                    pending.append(_Written(", "))
            pending.append(_Written("{"))
        elif isinstance(item, (list, tuple)):
            pending.append(_Written("]"))
            for index, member in enumerate(reversed(item)):
                pending.append(member)
                if index < len(item) - 1:
                    pending.append(_Written(", "))
            pending.append(_Written("["))
        elif item is None or isinstance(item, (str, int, float)):
            parts.append(json.dumps(item))
        else:
            parts.append(json.dumps(repr(item)))
    return "".join(parts)


def _json_key(key: Any) -> str:
    return json.dumps(key if isinstance(key, str) else json.dumps(key))


def _sorted_members(mapping: dict[Any, Any]) -> list[tuple[Any, Any]]:
    """Last key first (they go on a stack), as ``json.dumps`` sorts them; keys that do not
    compare (a str and an int) by their JSON text instead of raising."""
    try:
        return sorted(mapping.items(), key=lambda member: member[0], reverse=True)
    except TypeError:
        return sorted(mapping.items(), key=lambda member: _json_key(member[0]), reverse=True)


def read_row(row: Any) -> FailureReport | None:
    """``row_report`` for a decoded line that may be anything: raises ``ValueError`` (never
    another error) when it is not a row or its failure data is invalid."""
    return read_row_failures(row).report


def read_row_failures(row: Any) -> RowFailures:
    """``row_failures`` for a decoded line that may be anything (``read_row``'s rules)."""
    if not isinstance(row, dict):
        raise ValueError("not a row: a row is a JSON object")
    if has_saved_report(row):
        try:
            fast = _canonical_saved_report(row)
        except TypeError:  # an unhashable value where a name belongs: row_failures names it
            fast = None
        if fast is not None:  # the body check is for the few rows that hold one (collection's hook)
            return RowFailures(fast, _servers_along(row, fast) if ROW_FAILURE_RESPONSE_BODY in row else _NO_SERVERS)
    elif ROW_FAILURE_CLASS not in row:
        return _NO_FAILURES  # no failure data: a success, or an old row
    try:
        return row_failures(row)
    except RecursionError:  # a pathologically nested value in a row
        raise ValueError("row: nested too deeply") from None


_NO_FAILURES: Final = RowFailures(None, _NO_SERVERS)


def row_masked(row: Mapping[str, Any]) -> bool:
    """Whether the row's sample is masked (its reward is no valid measurement), as Gym's
    ``BaseVerifyResponse`` reads it: ``mask_sample``, else the older
    ``instance_config.mask_sample``, lax booleans either way."""
    value = row.get(ROW_MASK_SAMPLE)
    if value is None:  # most rows: a failure row says nothing of masking
        instance_config = row.get(ROW_INSTANCE_CONFIG)
        if instance_config is None:  # no need for the slower Mapping check
            return False
        return isinstance(instance_config, Mapping) and _lax_bool(instance_config.get(ROW_MASK_SAMPLE))
    if value is True or value is False:
        return value
    return _lax_bool(value)


ROW_INSTANCE_CONFIG: Final = "instance_config"


def _lax_bool(value: Any) -> bool:
    if value is None or isinstance(value, (dict, list)):
        return False
    try:
        return bool(_LAX_BOOL.validate_python(value))
    except ValidationError:
        return False


_LAX_BOOL: Final = TypeAdapter(bool)


# A saved report in its canonical form (what ``report_row`` writes: known keys only, exact
# types, every bound met) is read here without pydantic, about five times faster; anything
# else goes to ``row_report``, which decides and names what is wrong. Both give the same
# report (tests/test_summary.py holds them to it).
_RECORD_KEYS: Final = frozenset(FailureRecord.__annotations__)  # the fields the record declares
_OPTIONAL_KEYS: Final = _RECORD_KEYS - REQUIRED_RECORD_KEYS
_FAST_CHECKED: Final = frozenset({"stage", "http_status", "operation", "cause_id", "foreign_error"})
"""The optional fields the fast path checks by hand. A record holding a field the record
declares beyond these (one added to ``FailureRecord`` since) is checked by ``RECORD_ADAPTER``
on its own, so adding a field needs nothing here."""
_HAND_CHECKED_KEYS: Final = REQUIRED_RECORD_KEYS | _FAST_CHECKED
_FOREIGN_KEYS: Final = frozenset(ForeignErrorRecord.__annotations__)
_BOUNDARIES: Final = frozenset(BOUNDARIES)
_STAGES: Final = frozenset(STAGES)


def _canonical_saved_report(row: Mapping[str, Any]) -> FailureReport | None:
    events = row.get(ROW_EVENTS, _NO_EVENTS)
    failure_id = row.get(ROW_FAILURE_ID)
    omitted = row.get(ROW_OMITTED, False)
    if type(events) is not dict or len(events) > MAX_REPORT_EVENTS or type(omitted) is not bool:
        return None
    if failure_id is not None and (type(failure_id) is not str or failure_id not in events):
        return None
    # A cause written after its effect (as every writer does: effect first) cannot close a
    # cycle; only a report with a cause written earlier pays for the full check.
    earlier: set[str] = set()
    backward = False
    unregistered: list[str] = []
    id_matches, max_id = EVENT_ID_RE.fullmatch, MAX_ID_CHARS
    hand_checks = _HAND_CHECKED_KEYS.issuperset  # a third faster than keys() <= the set
    for event_id, record in events.items():
        if type(record) is not dict:
            return None
        get = record.get
        reason = get("failure_reason")
        if (
            get("event_id") != event_id
            or type(reason) is not str
            or len(reason) > MAX_REASON_CHARS
            or get("boundary") not in _BOUNDARIES
            # the usual id, ASCII letters and digits, told at half the regex's cost (bytes.isalnum
            # is ASCII's table; str.isalnum is Unicode's, as slow as the regex)
            or not (
                (
                    (type(event_id) is str and event_id.isascii() and event_id.encode().isalnum())
                    and len(event_id) <= max_id
                )
                or id_matches(event_id) is not None
            )
        ):
            return None
        kind: Any = get("failure_kind")
        if kind not in FAILURE_KINDS and kind not in _NAMESPACED_SEEN:
            if not is_well_formed(kind):
                return None
            unregistered.append(kind)
        earlier.add(event_id)
        if len(record) == _REQUIRED_KEYS:
            continue  # the four every record has, checked above: nothing optional to check
        keys = record.keys()
        hand_checked = hand_checks(record)  # the usual record: no subset test beyond this one
        if not hand_checked and not keys <= _RECORD_KEYS:
            return None
        if "cause_id" in keys:
            cause = record["cause_id"]
            if cause not in events:
                return None
            backward = backward or cause in earlier
        if "stage" in keys and record["stage"] not in _STAGES:
            return None
        if "http_status" in keys and not is_http_status(record["http_status"]):
            return None
        if "foreign_error" in keys and not _canonical_foreign(record["foreign_error"]):
            return None
        if "operation" in keys and not (
            type(record["operation"]) is str and OPERATION_RE.fullmatch(record["operation"])
        ):
            return None
        if not hand_checked and not _declared_record(record):
            return None
    if backward:
        try:
            check_acyclic(events)
        except ValueError:
            return None
    for kind in unregistered:
        validate_failure_kind(kind)  # warns once for an unregistered kind, as row_report does
        if is_namespaced(kind) and len(_NAMESPACED_SEEN) < _MAX_NAMESPACED_SEEN:
            _NAMESPACED_SEEN.add(kind)
    return FailureReport._trusted(events, failure_id, omitted)


_REQUIRED_KEYS: Final = len(REQUIRED_RECORD_KEYS)


_NAMESPACED_SEEN: Final[set[str]] = set()
"""Namespaced kinds read already: well-formed, and never warned of, so the next record of one
skips both checks (a regex each). Bounded by ``_MAX_NAMESPACED_SEEN``."""
_MAX_NAMESPACED_SEEN: Final = 1024


def _declared_record(record: Mapping[str, Any]) -> bool:
    try:
        RECORD_ADAPTER.validate_python(record)
    except ValidationError:
        return False
    return True


_NO_EVENTS: Final[dict[str, Any]] = {}


def _canonical_foreign(foreign: Any) -> bool:
    return (
        type(foreign) is dict
        and foreign.keys() <= _FOREIGN_KEYS
        and type(foreign.get("type")) is str
        and 1 <= len(foreign["type"]) <= MAX_TYPE_CHARS
        and type(foreign.get("message")) is str
        and len(foreign["message"]) <= MAX_REASON_CHARS
        and ("http_status" not in foreign or is_http_status(foreign["http_status"]))
    )
