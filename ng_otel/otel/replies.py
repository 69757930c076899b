"""What a failed reply told its caller, kept on the exception raised for it.

A caller's HTTP client raises its own error for a failed reply (aiohttp's
``ClientResponseError``), which holds no reference to the reply. The client adapter attaches
what the reply said (its report) and where the request went out from (the span context it
carried), so the failure the caller records later is caused by the callee's event and sits
in the same trace, however far up the stack it is recorded.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from opentelemetry.trace import SpanContext

from ng_otel.contract.events import walk_explicit_chain
from ng_otel.contract.report import FailureReport

_ATTRIBUTE: Final = "_ng_otel_reply"


class ReplyEvidence(NamedTuple):  # a tuple: made for every failed reply, a third of a frozen dataclass's cost
    status: int
    report: FailureReport | None  # what the callee reported, if it reported
    context: SpanContext  # the span the request went out under


def attach_reply(error: BaseException, evidence: ReplyEvidence) -> None:
    try:
        setattr(error, _ATTRIBUTE, evidence)
    except (AttributeError, TypeError):  # an exception type with slots: the failure stays uncaused
        pass


def reply_of(error: BaseException) -> ReplyEvidence | None:
    """The reply evidence on ``error`` or the nearest exception of its explicit chain."""
    for current in walk_explicit_chain(error):
        evidence = current.__dict__.get(_ATTRIBUTE) if hasattr(current, "__dict__") else None
        if isinstance(evidence, ReplyEvidence):
            return evidence
    return None
