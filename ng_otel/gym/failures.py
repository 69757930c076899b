"""Stock NeMo Gym 0.7.0's failures as Gym failure events.

No released Gym raises ``NgFailureEvent``: a handler raises an ordinary exception, and Gym's
catch-all (``SimpleServer.setup_exception_middleware``) answers it with a JSON 500. Each such
exception becomes one event at the boundary of the server that saw it, of a registered kind
chosen the way Gym's own code names what happened (``base_responses_api_model``'s
``_classify_status``/``_classify_exception``, ``rollout_collection``'s ``agent_run_error``),
the third-party error kept as ``foreign_error``, and caused by the callee's event when the
exception is a failed reply that carried one.
"""

from __future__ import annotations

import asyncio
import errno
from typing import Any, Final

from ng_otel.contract import kinds as k
from ng_otel.contract.events import MAX_REASON_CHARS, ForeignError, NgFailureEvent, bound_text
from ng_otel.contract.inner_errors import GYM_ERROR_STATUS, RUN_ERROR_KINDS
from ng_otel.contract.report import FailureReport
from ng_otel.otel.recovery import last_attempt_of
from ng_otel.otel.replies import ReplyEvidence, reply_of

# An upstream status that names the failure whoever saw it (Gym: "timeout", "rate_limit").
STATUS_KINDS: Final = {408: k.TRANSPORT_TIMEOUT, 504: k.TRANSPORT_TIMEOUT, 429: k.PROVIDER_QUOTA_EXHAUSTED}
# By class name along the exception's MRO, nearest first: aiohttp's and the standard
# library's, matched by name so that this module imports neither.
EXCEPTION_KINDS: Final = {
    "CancelledError": k.CANCELLED,
    "ServerTimeoutError": k.TRANSPORT_TIMEOUT,
    "ConnectionTimeoutError": k.TRANSPORT_TIMEOUT,
    "TimeoutError": k.TRANSPORT_TIMEOUT,
    "ServerDisconnectedError": k.TRANSPORT_PEER_DROP,
    "ClientConnectorError": k.TRANSPORT_UNREACHABLE,
    "ConnectionRefusedError": k.TRANSPORT_UNREACHABLE,
    "ClientOSError": k.TRANSPORT_PEER_DROP,
    "ConnectionError": k.TRANSPORT_PEER_DROP,
}
LOCAL_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
MAX_BODY_QUOTED: Final = 1000  # of a failed reply's body, in the reason


def failure_kind_of(error: BaseException, boundary: str, http_status: int | None = None) -> str:
    """The registered kind for ``error`` escaping (or seen) at ``boundary``; ``http_status``:
    the failed reply's status it carries, if any."""
    if isinstance(error, OSError) and error.errno in LOCAL_RESOURCE_ERRNOS:
        return k.TRANSPORT_LOCAL_RESOURCE
    for cls in type(error).__mro__:
        kind = EXCEPTION_KINDS.get(cls.__name__)
        if kind is not None:
            return kind
    if http_status in STATUS_KINDS:
        return STATUS_KINDS[http_status]
    return RUN_ERROR_KINDS[boundary]


def escaped_failure(
    error: BaseException,
    boundary: str,
    where: str,
    *,
    http_status: int | None = GYM_ERROR_STATUS,
    kind: str | None = None,
) -> FailureReport:
    """The report of ``error``, which ended an operation at ``boundary`` in ``where`` (a
    server's name): one event, caused by the callee's failure when ``error`` is a failed
    reply that carried a report, with that report's events beside it."""
    foreign = ForeignError.from_exception(error)
    kind = kind or failure_kind_of(error, boundary, foreign.http_status)
    if kind == k.CANCELLED:
        http_status = None  # the client went away or the server is stopping: no server error
    event = NgFailureEvent(
        kind,
        _reason(error, foreign, where),
        boundary=boundary,
        http_status=http_status,
        foreign_error=foreign,
    )
    record = event.to_record()
    evidence = reply_of(error)
    cause = _callee_failure(evidence)
    attempt = last_attempt_of(error) if cause is None else None  # the request loop gave up on it
    if attempt is not None:
        cause = next(iter(attempt.events), None)
    if cause is not None:
        record["cause_id"] = cause
    own = FailureReport._trusted({event.event_id: record}, event.event_id)
    if attempt is not None:
        return own.merge(attempt)
    return own.merge(evidence.report) if evidence is not None and evidence.report is not None else own


def _callee_failure(evidence: ReplyEvidence | None) -> str | None:
    if evidence is None or evidence.report is None:
        return None
    return evidence.report.failure_id


def _reason(error: BaseException, foreign: ForeignError, where: str) -> str:
    """What a person reads first: a failed reply's own words (where the provider says
    "backend overloaded"), else the exception's; its type and message stay in the event's
    foreign error either way."""
    body = _body_of(error)
    if body:
        status = f" {foreign.http_status}" if foreign.http_status is not None else ""
        return bound_text(f"{where} got a failed reply{status}: {body}", MAX_REASON_CHARS)
    short_type = foreign.type.rsplit(".", 1)[-1]
    text = f"{short_type} in {where}: {foreign.message}" if foreign.message else f"{short_type} in {where}"
    return bound_text(text, MAX_REASON_CHARS)


def _body_of(error: BaseException) -> str:
    """The start of a failed reply's body, which Gym keeps on ``ClientResponseError`` as
    ``response_content``: where the callee said what went wrong."""
    try:
        content: Any = error.__dict__.get("response_content") if hasattr(error, "__dict__") else None
    except Exception:
        return ""
    if isinstance(content, (bytes, bytearray)):
        return bytes(content[: MAX_BODY_QUOTED * 4]).decode("utf-8", "replace")[:MAX_BODY_QUOTED]
    if isinstance(content, str):
        return content[:MAX_BODY_QUOTED]
    return ""


# rollout_collection._SERVER_DID_NOT_RUN_STATUSES: statuses something in front of the server
# answers with, so the rollout never ran; any other status means it ran and broke.
GATEWAY_STATUSES: Final = frozenset({429, 502, 503, 504})


def collection_failure_kind(status: int | None) -> str:
    """The class Gym 0.7.0's collection gives a failed ``/run`` (``_agent_request_failure_row``)."""
    ran = status is not None and status not in GATEWAY_STATUSES
    return k.AGENT_RUN_ERROR if ran else k.AGENT_REQUEST_FAILED


def attempt_kind(error: BaseException, boundary: str) -> str | None:
    """The kind of one failed attempt of Gym's request loop (``server_utils.request``), which
    resends on any exception (dropped connections forever, others up to three tries); a
    cancelled attempt is no failure of the request."""
    if isinstance(error, asyncio.CancelledError):
        return None
    return failure_kind_of(error, boundary)
