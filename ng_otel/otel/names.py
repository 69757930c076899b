"""Every telemetry name ng_otel emits: the project's semantic conventions (docs/conventions.md).

Tests, docs, collector configs and alert rules use these exact strings; nothing else in the
package spells them.
"""

from __future__ import annotations

from typing import Final

from ng_otel.contract.header import REPORT_HEADER as REPORT_HEADER

EVENT: Final = "ng.failure"
"""Span event name, and ``event_name`` of the log record in logs mode."""
LATE_SPAN_PREFIX: Final = "ng.failure "
"""A failure whose span has ended goes on a short span named ``ng.failure <kind>``."""

BOUNDARY: Final = "ng.failure.boundary"  # 6 values: safe as a metric label
KIND: Final = "ng.failure.kind"  # bounded by the cardinality guard
STAGE: Final = "ng.failure.stage"  # 5 values
RECOVERED: Final = "ng.failure.recovered"  # off the causal chain of the reply's own failure
CLASS: Final = "ng.failure.class"  # infra / data
ID: Final = "ng.failure.id"  # unbounded: events and links only
CAUSE_ID: Final = "ng.failure.cause_id"  # unbounded: events and links only
REASON: Final = "ng.failure.reason"  # unbounded, may hold personal data: events only
OPERATION: Final = "ng.failure.operation"
FOREIGN_TYPE: Final = "ng.failure.foreign.type"
FOREIGN_MESSAGE: Final = "ng.failure.foreign.message"
FOREIGN_HTTP_STATUS: Final = "ng.failure.foreign.http_status"
HTTP_STATUS: Final = "http.response.status_code"
RESEND_COUNT: Final = "http.request.resend_count"  # on a failed attempt's event and span: 0 for the first
HTTP_METHOD: Final = "http.request.method"
URL_FULL: Final = "url.full"  # without its query, which may hold keys
ERROR_TYPE: Final = "error.type"

EVENT_ATTRIBUTES: Final = (
    ID,
    BOUNDARY,
    KIND,
    REASON,
    RECOVERED,
    CLASS,
    CAUSE_ID,
    STAGE,
    HTTP_STATUS,
    OPERATION,
    FOREIGN_TYPE,
    FOREIGN_MESSAGE,
    FOREIGN_HTTP_STATUS,
)
"""Every attribute an ``ng.failure`` event may carry, besides one of its context's
(``ng.verify.masked`` on a verify outcome, ``http.request.resend_count`` on a failed attempt)."""
RECORD_ATTRIBUTES: Final = (
    ("event_id", ID),
    ("boundary", BOUNDARY),
    ("failure_kind", KIND),
    ("failure_reason", REASON),
    ("cause_id", CAUSE_ID),
    ("stage", STAGE),
    ("http_status", HTTP_STATUS),
    ("operation", OPERATION),
)
"""(record key, event attribute) for each flat field of a failure record (``FailureRecord``):
``ng_otel.otel.attributes`` writes and reads an event through it, so a record survives the
round trip; a field added to the record is added here (a test holds the two together)."""
FOREIGN_ATTRIBUTES: Final = (("type", FOREIGN_TYPE), ("message", FOREIGN_MESSAGE), ("http_status", FOREIGN_HTTP_STATUS))
"""(key, event attribute) for each field of a record's ``foreign_error``."""

LINK_ATTRIBUTES_COUNT: Final = 3  # ng.link.type, ng.failure.id, ng.failure.cause_id

LINK_TYPE: Final = "ng.link.type"
LINK_CAUSED_BY: Final = "caused_by"
LINK_REPLAY_OF: Final = "replay_of"  # from a replayed span to the live span its events were first recorded on

FAILURES_METRIC: Final = "ng.failures"
FAILURES_UNIT: Final = "{failure}"
FAILURES_DESCRIPTION: Final = "Gym failure events, each counted once by the first process that records it"
METRIC_LABELS: Final = frozenset({BOUNDARY, KIND, STAGE, RECOVERED, CLASS})

VERIFY_MASKED: Final = "ng.verify.masked"
VERIFY_METRIC: Final = "ng.verify.outcomes"
VERIFY_UNIT: Final = "{outcome}"
VERIFY_DESCRIPTION: Final = "Verify responses, by whether the reward is a valid measurement"
VERIFY_LABELS: Final = frozenset({VERIFY_MASKED, KIND})
VERIFY_NO_KIND: Final = "none"

OMITTED_METRIC: Final = "ng.failure_reports.omitted"
OMITTED_UNIT: Final = "{report}"
OMITTED_DESCRIPTION: Final = 'Failure reports this process had to replace with {"omitted": true} (over 4096 bytes)'
UNEXPORTED_METRIC: Final = "ng.failures.unexported"
UNEXPORTED_UNIT: Final = "{failure}"
UNEXPORTED_DESCRIPTION: Final = "ng.failure events recorded here whose span export failed"
SPAN_EVENTS_METRIC: Final = "ng.failure.span_events"
"""What the collector's count connector calls its count of ``ng.failure`` span events."""

INVALID_KIND: Final = "_invalid"  # metric label for a malformed kind
OTHER_KIND: Final = "_other"  # metric label once NG_OTEL_MAX_KINDS distinct kinds were seen

CONTEXT_HEADER: Final = "X-NG-Failure-Context"
"""Reply header: JSON map event id -> ``<32 hex trace id>-<16 hex span id>`` of the span on
which the callee recorded it; all zeros when it was exported on a span it cannot name."""
SSE_EVENT: Final = "ng_failure_report"
"""Server-sent event name carrying the report when a streamed reply's headers are gone."""
SSE_CONTEXT_EVENT: Final = "ng_failure_context"
"""Server-sent event name carrying the context map after ``ng_failure_report``."""

ROW_CONTEXTS: Final = "_ng_failure_contexts"
"""Collection row key beside the contract's: event id -> span context, as in the header."""
REPLAY_SPAN: Final = "ng.replay"
"""Span that carries the events of one replayed row that were not exported live."""

INSTRUMENTATION_SCOPE: Final = "ng_otel"

# -- recovery: retries, rollout outcomes, stalled work (docs/conventions.md "Recovery") ------

RETRY_EXHAUSTED: Final = "ng.retry.exhausted"
"""On a failed attempt's event of a known retry loop: true on the attempt that ended the loop
(no retry followed), false on each one that was retried."""
RETRY_OUTCOME: Final = "ng.retry.outcome"  # 4 values: the logical operation's, counted once
RETRY_SUCCEEDED: Final = "succeeded_without_retry"
RETRY_SUCCEEDED_AFTER_RETRY: Final = "succeeded_after_retry"
RETRY_FAILED_AFTER_RETRY: Final = "failed_after_retry"
RETRY_FAILED: Final = "failed_without_retry"
RETRY_OUTCOMES: Final = (RETRY_SUCCEEDED, RETRY_SUCCEEDED_AFTER_RETRY, RETRY_FAILED_AFTER_RETRY, RETRY_FAILED)
RETRY_NO_KIND: Final = "none"  # the kind label of an operation that never failed
RETRY_METRIC: Final = "ng.retry.outcomes"
RETRY_UNIT: Final = "{operation}"
RETRY_DESCRIPTION: Final = "Operations that may retry (Gym's request loop, retry_loop), each counted once by outcome"
RETRY_LABELS: Final = frozenset({BOUNDARY, KIND, RETRY_OUTCOME})
RETRY_DELAY_METRIC: Final = "ng.retry.delay"
RETRY_DELAY_UNIT: Final = "s"
RETRY_DELAY_DESCRIPTION: Final = "Time a retried operation spent before its last attempt began (attempts and waits)"
RETRY_DELAY_LABELS: Final = frozenset({BOUNDARY, RETRY_OUTCOME})

ROLLOUT_AGENT: Final = "ng.rollout.agent"  # the agent's Gym config name, bounded by NG_OTEL_MAX_AGENTS
ROLLOUT_OUTCOME: Final = "ng.rollout.outcome"  # 4 values, as collection decides them
ROLLOUT_MEASURED: Final = "measured"
ROLLOUT_MASKED: Final = "masked"
ROLLOUT_FAILED: Final = "failed"
ROLLOUT_OMITTED: Final = "omitted"
ROLLOUT_OUTCOMES: Final = (ROLLOUT_MEASURED, ROLLOUT_MASKED, ROLLOUT_FAILED, ROLLOUT_OMITTED)
ROLLOUT_METRIC: Final = "ng.rollout.outcomes"
ROLLOUT_UNIT: Final = "{rollout}"
ROLLOUT_DESCRIPTION: Final = "Rollouts by the outcome rollout collection gave them, counted as it decides each"
ROLLOUT_LABELS: Final = frozenset({ROLLOUT_AGENT, ROLLOUT_OUTCOME, KIND})
ROLLOUT_STALLED: Final = "ng.rollout.stalled"
"""True on the ``ng.failure`` event of a rollout in flight past ``NG_OTEL_STALL_SECONDS``."""
ROLLOUT_AGE: Final = "ng.rollout.age"  # seconds the stalled rollout had been in flight (event only)
IN_FLIGHT_METRIC: Final = "ng.rollouts.in_flight"
IN_FLIGHT_UNIT: Final = "{rollout}"
IN_FLIGHT_DESCRIPTION: Final = "Rollouts collection has dispatched whose /run has not answered"
OLDEST_AGE_METRIC: Final = "ng.rollouts.oldest_age"
OLDEST_AGE_UNIT: Final = "s"
OLDEST_AGE_DESCRIPTION: Final = "Age of the oldest rollout in flight (0 when none is)"
STALLED_METRIC: Final = "ng.rollouts.stalled"
STALLED_UNIT: Final = "{rollout}"
STALLED_DESCRIPTION: Final = "Rollouts in flight for longer than NG_OTEL_STALL_SECONDS"
OTHER_AGENT: Final = "_other"  # metric label once NG_OTEL_MAX_AGENTS distinct agents were seen

# -- JSON lines when OpenTelemetry is off (docs/conventions.md "JSON lines") -----------------

LINE_RECORD: Final = "ng.record"
"""Key of a JSON line's record type: ``ng.failure``, ``ng.retry`` or ``ng.rollout``."""
LINE_RETRY: Final = "ng.retry"
LINE_ROLLOUT: Final = "ng.rollout"
LINE_RECORDS: Final = (EVENT, LINE_RETRY, LINE_ROLLOUT)
LINE_TIME: Final = "time_unix_nano"
LINE_TRACE_ID: Final = "trace_id"  # 32 lowercase hex, absent outside any trace
LINE_SPAN_ID: Final = "span_id"  # 16 lowercase hex, with the trace id
LINE_SERVICE: Final = "service.name"
RETRY_DELAY: Final = "ng.retry.delay"  # on a retry outcome line: seconds, as the histogram
ROLLOUT_TASK_INDEX: Final = "ng.rollout.task_index"  # on a rollout outcome line: Gym's _ng_task_index
ROLLOUT_INDEX: Final = "ng.rollout.index"  # on a rollout outcome line: Gym's _ng_rollout_index
