"""Failures that are returned, not raised: handled episode failures and verify outcomes.

Handled episode failures as Gym Main's "Failure observations" documentation describes them
(``handled_episode_failure``; the v1 ``EpisodeFailure`` under ``failure`` in NeMo Gym 0.7.0
``nemo_gym/episode_types.py``'s ``BaseEpisodeResponse``, with ``failure_report`` beside it).
Verify outcomes as 0.7.0 ``nemo_gym/base_resources_server.py``'s ``BaseVerifyResponse``
carries them (``reward``, ``mask_sample``, ``failure_kind``, ``failure_reason`` are orthogonal;
a masked sample is a failure of measurement, not a zero score). Both reach the same telemetry
and reports as raised failures, without an error status on the span: the operation itself
succeeded.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ng_otel.contract.events import NgFailureEvent
from ng_otel.contract.kinds import is_well_formed
from ng_otel.contract.records import EpisodeFailure, VerifyOutcome
from ng_otel.contract.report import FailureReport, failure_report_for
from ng_otel.otel import names
from ng_otel.otel._guard import guarded
from ng_otel.otel.failure_log import current_failure_log
from ng_otel.otel.recorder import get_recorder, is_enabled

VERIFY_OPERATION = "verify"
NO_REASON = "verify named a failure_kind without a failure_reason"

__all__ = ["HandledFailure", "episode_response", "handled_episode_failure", "record_verify_outcome"]


@dataclass(frozen=True)
class HandledFailure:
    """An environment's handled failure with its local decision and evidence, kept apart.
    ``partial`` stays here: the v1 response has no field for it."""

    event: NgFailureEvent
    terminal: bool
    partial: Any = None


_handled: ContextVar[tuple[HandledFailure, ...]] = ContextVar("ng_otel_handled_failures", default=())
MAX_HANDLED_KEPT = 256
"""Handled failures one context keeps for its episode response. Called outside any request
and never answered, they would pile up for the life of the process; each was recorded (and
exported) when it was handled, so only the response loses the oldest."""


def _kept(handled: tuple[HandledFailure, ...], new: HandledFailure) -> tuple[HandledFailure, ...]:
    kept = (*handled, new)
    if len(kept) <= MAX_HANDLED_KEPT:
        return kept
    decisive = next((item for item in kept if item.terminal), None)  # the response's answer stays
    if decisive is None or decisive in kept[-MAX_HANDLED_KEPT:]:
        return kept[-MAX_HANDLED_KEPT:]
    return (decisive, *kept[-(MAX_HANDLED_KEPT - 1) :])


def handled_episode_failure(
    failure_kind: str,
    failure_reason: str,
    *,
    stage: str,
    terminal: bool,
    partial: Any = None,
    boundary: str = "environment",
    http_status: int | None = None,
    operation: str | None = None,
    cause: BaseException | None = None,
) -> NgFailureEvent:
    """Build and record an episode failure the environment handles instead of raising.

    Pass ``cause=err`` inside ``except ... as err`` for the explicit cause. The first terminal
    failure becomes the reply's own failure; later ones (cleanup) are reported beside it. The
    event's fields are validated like any ``NgFailureEvent`` (``ValueError`` for a bad kind or
    stage: a bug at the call site); recording never raises. ``partial`` evidence is the
    environment's to place in its own protocol: NeMo Gym 0.7.0's ``BaseEpisodeResponse`` and
    v1 ``EpisodeFailure`` reject unknown keys, so ``episode_response`` never writes it.
    """
    event = NgFailureEvent(
        failure_kind, failure_reason, boundary=boundary, stage=stage, http_status=http_status, operation=operation
    )
    if cause is not None:
        event.__cause__ = cause
    _handled.set(_kept(_handled.get(), HandledFailure(event, terminal, partial)))
    report = failure_report_for(event)
    if report is not None:
        _record_returned(report, decisive=terminal, terminal=(event.event_id,) if terminal else ())
    return event


def episode_response(response: Mapping[str, Any] | None = None, *, with_report: bool = True) -> dict[str, Any]:
    """The environment's episode response after cleanup, shaped as NeMo Gym 0.7.0's
    ``BaseEpisodeResponse`` (``episode_id``, ``task_id``, exactly one of ``result`` and
    ``failure``), with the failures handled while serving it.

    Without a handled failure ``response`` comes back unchanged. A response that keeps a
    ``result`` and handled only non-terminal failures (a failed cleanup) keeps its result.
    Otherwise the first terminal (else the first) handled failure is the answer: ``failure``
    is its v1 ``EpisodeFailure`` (four fields, the kind its own, never a cause's) and
    ``result`` is null. Either way ``failure_report`` beside it holds every handled failure,
    late cleanup ones included; ``with_report=False`` leaves it out for a response model that
    does not declare it (0.7.0's forbids unknown keys; the reply header still carries the
    report). It consumes the handled failures: call it once, after cleanup."""
    answer = dict(response or {})
    handled = _handled.get()
    if not handled:
        return answer
    _handled.set(())  # the episode is answered: its failures go with this response only
    terminal = next((item for item in handled if item.terminal), None)
    decisive = terminal or handled[0]
    if terminal is not None or answer.get("result") is None:
        event = decisive.event
        envelope = EpisodeFailure(
            failure_reason=event.failure_reason,
            terminal=decisive.terminal,
            failure_kind=event.failure_kind,
            stage=event.stage,
        )
        answer["result"] = None
        answer["failure"] = envelope.model_dump(mode="json")
    if with_report:
        log = current_failure_log()
        report = log.report if log else _report_of(handled, decisive)
        answer["failure_report"] = report.to_dict()
    return answer


def _report_of(handled: tuple[HandledFailure, ...], decisive: HandledFailure) -> FailureReport:
    # Without a request's failure log (no middleware): the same report the log would hold.
    report = (failure_report_for(decisive.event) if decisive.terminal else None) or FailureReport()
    for item in handled:
        report = report.merge(failure_report_for(item.event) or FailureReport())
    return report


@guarded
def record_verify_outcome(response: Any) -> VerifyOutcome | None:
    """Count one verify response in ``ng.verify.outcomes`` (masked or not, by kind or
    ``none``), and record a named ``failure_kind`` as an ``ng.failure`` event with
    ``ng.verify.masked``. Read as ``BaseVerifyResponse`` reads it: an unregistered kind warns
    and is counted under the guard's bounded label (``_other`` past the limit, ``_invalid``
    for a malformed one, which no event can carry); ``mask_sample`` takes lax booleans, and
    when absent the older ``instance_config.mask_sample`` decides. The reward is never a label
    nor a metric. Returns the outcome read, ``None`` for a body ``BaseVerifyResponse`` would
    reject. Call it once per response (the ASGI middleware does, on ``/verify``). Never
    raises."""
    if not is_enabled():
        return None
    try:
        outcome = VerifyOutcome.from_response(response)
    except (TypeError, ValueError):
        return None  # not a verify response: nothing to count, nothing to break
    recorder = get_recorder()
    kind = outcome.failure_kind
    label = recorder.kinds.label(kind) if kind is not None else names.VERIFY_NO_KIND
    recorder.verify_outcomes.add(1, {names.VERIFY_MASKED: outcome.mask_sample, names.KIND: label})
    if kind is not None and is_well_formed(kind):
        event = NgFailureEvent(
            kind,
            outcome.failure_reason or NO_REASON,
            boundary="resources_server",
            stage="verification",
            operation=VERIFY_OPERATION,
        )
        report = _caused_by_callee(event)
        _record_returned(report, decisive=True, extra={names.VERIFY_MASKED: outcome.mask_sample})
    return outcome


def _caused_by_callee(event: NgFailureEvent) -> FailureReport:
    """``event`` (a failure the verify reply names: judge_failsafe's ``judge_failed``) caused
    by the latest failure a callee's reply reported in this request (the judge model's),
    with that failure's chain: the request answered instead of raising, so no ``raise ...
    from`` says it, but nothing else in the request failed before it answered."""
    record = event.to_record()
    log = current_failure_log()
    cause = log.last_callee_failure if log is not None else None
    if cause is None:
        return FailureReport._trusted({event.event_id: record}, event.event_id)
    chain = log.report.chain(cause) if log is not None else []
    record["cause_id"] = cause
    return FailureReport._trusted({event.event_id: record, **{r["event_id"]: r for r in chain}}, event.event_id)


@guarded
def _record_returned(
    report: FailureReport,
    *,
    decisive: bool,
    extra: Mapping[str, Any] | None = None,
    terminal: tuple[str, ...] = (),
) -> None:
    # A returned failure is the reply's own unless one came first; it never marks the span
    # ERROR, because the operation did not fail: it reported a failure.
    log = current_failure_log()
    own = decisive and (log is None or log.report.failure_id is None)
    get_recorder().record(report, own=False, recovered=not own, event_attributes=extra, terminal=terminal)
    if log is not None:
        log.add(report, own=own)
