"""Recovery telemetry (Gym #3182): retry loops, rollout outcomes and work in flight, in one
bounded convention (docs/conventions.md, "Recovery").

- A **retry loop** (``RetryLoop``: NeMo Gym's request loop, through ``ng_otel.gym.request_loop``;
  your own, through ``retry_loop``) reports each failed attempt as an ``ng.failure`` event with
  ``http.request.resend_count`` and ``ng.retry.exhausted``, and its outcome once, when it ends,
  in ``ng.retry.outcomes`` (``succeeded_without_retry``, ``succeeded_after_retry``,
  ``failed_after_retry``, ``failed_without_retry``) by boundary and kind; a loop that retried
  adds the time before its last attempt to the ``ng.retry.delay`` histogram.
- A **rollout outcome** (``count_rollout``: measured, masked, failed, omitted) is counted in
  ``ng.rollout.outcomes`` by agent (bounded by ``NG_OTEL_MAX_AGENTS``) and kind.
- **Rollouts in flight** (``RolloutsInFlight``) are observable gauges (``ng.rollouts.in_flight``,
  ``ng.rollouts.oldest_age``, ``ng.rollouts.stalled``); one in flight past
  ``NG_OTEL_STALL_SECONDS`` is one ``ng.failure`` event (``agent_timeout`` at
  ``collection``, ``ng.rollout.stalled=true``).

Counts live in locked dicts observed when a reader collects (as ``ng.failures`` does), so an
operation that never fails costs a dict increment. When OpenTelemetry is off, each retry
outcome of a loop that retried or failed, and each rollout outcome, is a JSON line
(``ng_otel.otel.jsonl``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, Final
from weakref import WeakKeyDictionary

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan, SpanContext

from ng_otel.contract import kinds as k
from ng_otel.contract.events import NgFailureEvent
from ng_otel.contract.kinds import FAILURE_KINDS, is_well_formed
from ng_otel.contract.report import FailureReport
from ng_otel.otel import names
from ng_otel.otel._guard import guarded
from ng_otel.otel.failure_log import current_failure_log
from ng_otel.otel.recorder import Failure, FailureRecorder, as_report, get_recorder, is_enabled

DELAY_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""``ng.retry.delay`` bucket bounds, seconds: Gym's loop waits 0.5 s between attempts."""
STALLED_KIND: Final = k.AGENT_TIMEOUT
STALLED_BOUNDARY: Final = "collection"

_current: ContextVar[RetryLoop | None] = ContextVar("ng_otel_retry_loop", default=None)


def current_loop() -> RetryLoop | None:
    """The retry loop the current task is in, if any (the aiohttp hook asks on failure)."""
    return _current.get()


# -- bounded labels ---------------------------------------------------------------------------


class NameGuard:
    """Bounds a metric label of configured names: the first ``max_names`` distinct names are
    themselves, later new ones ``_other`` (as the kinds guard bounds ``ng.failure.kind``)."""

    def __init__(self, max_names: int, other: str = names.OTHER_AGENT) -> None:
        self._max = max_names
        self._other = other
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def label(self, name: str) -> str:
        if name in self._seen:
            return name
        with self._lock:
            if len(self._seen) >= self._max:
                return self._other
            self._seen.add(name)
        return name


def _kind_label(recorder: FailureRecorder, kind: str | None) -> str:
    if kind is None:
        return names.RETRY_NO_KIND
    return recorder.kinds.label(kind) if kind in FAILURE_KINDS or is_well_formed(kind) else names.INVALID_KIND


# -- the instruments ----------------------------------------------------------------------------


class _Tally:
    """Running totals by label tuple, observed as a cumulative counter."""

    __slots__ = ("_counts", "_keys", "_lock")

    def __init__(self, keys: tuple[str, ...]) -> None:
        self._keys = keys
        self._counts: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def add(self, labels: tuple[str, ...]) -> None:
        with self._lock:
            self._counts[labels] = self._counts.get(labels, 0) + 1

    def observe(self, options: CallbackOptions | None = None) -> Iterable[Observation]:
        with self._lock:
            totals = list(self._counts.items())
        return [Observation(count, dict(zip(self._keys, labels, strict=True))) for labels, count in totals]

    def totals(self) -> dict[tuple[str, ...], int]:
        with self._lock:
            return dict(self._counts)


class Instruments:
    """The recovery instruments of one meter (one set per meter, as ``ng.failures``)."""

    def __init__(self, meter: Meter) -> None:
        self.retries = _Tally((names.BOUNDARY, names.KIND, names.RETRY_OUTCOME))
        self.rollouts = _Tally((names.ROLLOUT_AGENT, names.ROLLOUT_OUTCOME, names.KIND))
        meter.create_observable_counter(
            names.RETRY_METRIC,
            callbacks=[self.retries.observe],
            unit=names.RETRY_UNIT,
            description=names.RETRY_DESCRIPTION,
        )
        meter.create_observable_counter(
            names.ROLLOUT_METRIC,
            callbacks=[self.rollouts.observe],
            unit=names.ROLLOUT_UNIT,
            description=names.ROLLOUT_DESCRIPTION,
        )
        self.delay = meter.create_histogram(
            names.RETRY_DELAY_METRIC,
            unit=names.RETRY_DELAY_UNIT,
            description=names.RETRY_DELAY_DESCRIPTION,
            explicit_bucket_boundaries_advisory=list(DELAY_BUCKETS),
        )
        meter.create_observable_gauge(
            names.IN_FLIGHT_METRIC,
            callbacks=[lambda options: in_flight().observe_count()],
            unit=names.IN_FLIGHT_UNIT,
            description=names.IN_FLIGHT_DESCRIPTION,
        )
        meter.create_observable_gauge(
            names.OLDEST_AGE_METRIC,
            callbacks=[lambda options: in_flight().observe_oldest()],
            unit=names.OLDEST_AGE_UNIT,
            description=names.OLDEST_AGE_DESCRIPTION,
        )
        meter.create_observable_gauge(
            names.STALLED_METRIC,
            callbacks=[lambda options: in_flight().observe_stalled()],
            unit=names.STALLED_UNIT,
            description=names.STALLED_DESCRIPTION,
        )


_instruments: WeakKeyDictionary[Meter, Instruments] = WeakKeyDictionary()
_instruments_lock = threading.Lock()


_latest: tuple[FailureRecorder | None, Instruments | None] = (None, None)  # the last recorder asked for


def instruments(recorder: FailureRecorder) -> Instruments:
    """The recovery instruments on ``recorder``'s meter, registered on first use."""
    global _latest
    known, tools = _latest
    if known is recorder and tools is not None:
        return tools
    meter = recorder.meter
    found = _instruments.get(meter)
    if found is None:
        with _instruments_lock:
            found = _instruments.get(meter)
            if found is None:
                found = _instruments[meter] = Instruments(meter)
    _latest = (recorder, found)
    return found


def count_success(boundary: str) -> None:
    """The healthy path: an operation that succeeded at its first attempt, counted."""
    instruments(get_recorder()).retries.add((boundary, names.RETRY_NO_KIND, names.RETRY_SUCCEEDED))


# -- retry loops --------------------------------------------------------------------------------


class RetryLoop:
    """One logical operation that may send its request again. Its failed attempts are
    ``ng.failure`` events with ``http.request.resend_count`` (0 for the first attempt) and
    ``ng.retry.exhausted``; its outcome is counted once, when it ends.

    As a context manager (``retry_loop``): each ``retry(failure)`` reports an attempt that
    failed and is retried (a recovered event); leaving the block normally ends the loop
    ``succeeded_*``, leaving it by an exception ends it ``failed_*``: a Gym failure in the
    exception's explicit chain is then recorded at once as the current operation's own
    failure (as ``record_failure`` records it), with ``ng.retry.exhausted=true`` and its
    resend count — the event that ended the loop.
    """

    __slots__ = (
        "_token",
        "boundary",
        "ended",
        "exhausted",
        "kind",
        "last_attempt_ns",
        "retries",
        "rollout",
        "span_context",
        "start_ns",
        "will_retry",
    )

    def __init__(self, boundary: str, *, will_retry: Callable[[BaseException], bool] | None = None) -> None:
        self.boundary = boundary
        self.will_retry = will_retry  # the loop's own rule (Gym's request loop), asked per failed attempt
        self.retries = 0  # failed attempts that were retried
        self.kind: str | None = None  # the kind of the latest failed attempt
        self.exhausted = False  # the latest failed attempt ended the loop
        self.start_ns = time.time_ns()
        self.last_attempt_ns = 0  # when the latest attempt began, where known
        self.ended = False
        self.span_context: SpanContext | None = None  # the request's own CLIENT span, where one was made
        self.rollout: _Rollout | None = None
        self._token: Token[RetryLoop | None] | None = None

    # -- as the current task's loop (the adapters' hooks find it) ------------------------------

    def enter(self) -> RetryLoop:
        self._token = _current.set(self)
        return self

    def leave(self) -> None:
        if self._token is not None:
            try:
                _current.reset(self._token)
            except ValueError:  # left in another context than it was entered in
                pass
            self._token = None

    # -- what an adapter's hook says ----------------------------------------------------------

    def attempt_failed(
        self, kind: str, error: BaseException | None, attempt_start_ns: int | None = None
    ) -> tuple[int, bool]:
        """One attempt failed with ``kind``: (its resend count, whether the loop sends again)."""
        resend_count = self.retries
        retried = True
        if self.will_retry is not None and error is not None:
            try:
                retried = self.will_retry(error)
            except Exception:
                retried = True
        self.kind = kind
        self.exhausted = not retried
        if attempt_start_ns:
            self.last_attempt_ns = attempt_start_ns
        if retried:
            self.retries += 1
        return resend_count, retried

    def attempt_started(self, attempt_start_ns: int) -> None:
        """The attempt after a failed one began at ``attempt_start_ns`` (wall clock)."""
        self.last_attempt_ns = attempt_start_ns

    # -- the user's side ------------------------------------------------------------------------

    def retry(self, failure: Failure) -> None:
        """Report an attempt that failed and is sent again: a recovered ``ng.failure`` event
        with its resend count, kept in the current request's report. Never raises."""
        if is_enabled():
            self._retry(failure)

    @guarded
    def _retry(self, failure: Failure) -> None:
        report = as_report(failure)
        if report is None:
            return
        resend_count, _ = self.attempt_failed(_report_kind(report) or names.RETRY_NO_KIND, None, time.time_ns())
        attributes = {names.RESEND_COUNT: resend_count, names.RETRY_EXHAUSTED: False}
        get_recorder().record(report, None, own=False, recovered=True, event_attributes=attributes)
        log = current_failure_log()
        if log is not None:
            log.add(report, own=False)

    @guarded
    def _ended_by(self, error: BaseException) -> None:
        """The block ended by ``error``: its Gym failure, if any, is the event that ends the loop."""
        report = as_report(error)
        if report is None or report.failure_id is None:
            self.exhausted = self.retries > 0
            return
        self.kind = _report_kind(report)
        self.exhausted = self.retries > 0
        attributes = {names.RESEND_COUNT: self.retries, names.RETRY_EXHAUSTED: self.exhausted}
        get_recorder().record(report, None, own=True, event_attributes=attributes)
        log = current_failure_log()
        if log is not None:
            log.add(report, own=True)

    def __enter__(self) -> RetryLoop:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if error is None:
            self.end(succeeded=True)
        elif isinstance(error, Exception):  # a cancelled block (CancelledError, KeyboardInterrupt) has no outcome
            if is_enabled():
                self._ended_by(error)
            self.end(succeeded=False)
        else:
            self.ended = True

    async def __aenter__(self) -> RetryLoop:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.__exit__(kind, error, traceback)

    # -- the end ----------------------------------------------------------------------------------

    def end(self, *, succeeded: bool, kind: str | None = None, context: SpanContext | None = None) -> None:
        """Count the loop's outcome once (later calls do nothing). ``kind``: the failure that
        ended it, when that is not its latest failed attempt's (a failed reply's)."""
        if self.ended:
            return
        self.ended = True
        if is_enabled():
            _count_retry(self, succeeded, kind, context)


def retry_loop(boundary: str) -> RetryLoop:
    """A retry loop of your own, at ``boundary``, as a context manager (``with`` or
    ``async with``)::

        with ng_otel.retry_loop("model") as loop:
            for attempt in range(3):
                try:
                    return call_backend()
                except TimeoutError as err:
                    failure = NgFailureEvent("transport_timeout", str(err), boundary="model")
                    if attempt == 2:
                        raise failure from err  # the loop ends failed_after_retry, exhausted
                    loop.retry(failure)  # recovered, http.request.resend_count = attempt

    The outcome is counted in ``ng.retry.outcomes`` when the block ends."""
    return RetryLoop(boundary)


def _report_kind(report: FailureReport) -> str | None:
    event_id = report.failure_id or next(iter(report.events), None)
    return report.events[event_id]["failure_kind"] if event_id is not None else None


@guarded
def _count_retry(loop: RetryLoop, succeeded: bool, kind: str | None, context: SpanContext | None) -> None:
    retried = loop.retries > 0
    if succeeded:
        outcome = names.RETRY_SUCCEEDED_AFTER_RETRY if retried else names.RETRY_SUCCEEDED
        kind = loop.kind if retried else None
    else:
        outcome = names.RETRY_FAILED_AFTER_RETRY if retried else names.RETRY_FAILED
        kind = kind or loop.kind
    recorder = get_recorder()
    tools = instruments(recorder)
    label = _kind_label(recorder, kind)
    tools.retries.add((loop.boundary, label, outcome))
    if not retried and succeeded:
        return  # the healthy path: one dict increment
    delay = max(0, (loop.last_attempt_ns or time.time_ns()) - loop.start_ns) / 1e9 if retried else 0.0
    if retried:
        tools.delay.record(delay, {names.BOUNDARY: loop.boundary, names.RETRY_OUTCOME: outcome})
    lines = recorder.lines
    if lines is not None and lines.active(recorder.tracer):
        attributes: dict[str, Any] = {
            names.BOUNDARY: loop.boundary,
            names.KIND: kind if kind is not None else names.RETRY_NO_KIND,
            names.RETRY_OUTCOME: outcome,
            names.RESEND_COUNT: loop.retries,
            names.RETRY_EXHAUSTED: loop.exhausted,
            names.RETRY_DELAY: round(delay, 6),
        }
        lines.write(names.LINE_RETRY, attributes, context or loop.span_context)


# -- rollout outcomes ---------------------------------------------------------------------------

_agents: NameGuard | None = None


def _agent_label(recorder: FailureRecorder, agent: str) -> str:
    global _agents
    if _agents is None:
        _agents = NameGuard(recorder.settings.max_agents)
    return _agents.label(agent)


@guarded
def count_rollout(
    agent: str,
    outcome: str,
    kind: str | None = None,
    *,
    event_id: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> None:
    """Count one rollout's outcome (``measured``, ``masked``, ``failed``, ``omitted``) as
    collection decided it, for ``agent`` (a configured name, bounded by ``NG_OTEL_MAX_AGENTS``)
    and the ``kind`` of its failure (``none`` without one). ``event_id``: the failure event
    the row saved (written on the JSON line, never a label)."""
    if not is_enabled():
        return
    recorder = get_recorder()
    label = _kind_label(recorder, kind)
    instruments(recorder).rollouts.add((_agent_label(recorder, agent), outcome, label))
    lines = recorder.lines
    if lines is not None and lines.active(recorder.tracer):
        line: dict[str, Any] = {
            names.ROLLOUT_AGENT: agent,
            names.ROLLOUT_OUTCOME: outcome,
            names.KIND: kind if kind is not None else names.RETRY_NO_KIND,
        }
        if event_id is not None:
            line[names.ID] = event_id
        if attributes:
            line.update(attributes)
        lines.write(names.LINE_ROLLOUT, line)


# -- rollouts in flight ---------------------------------------------------------------------------


class _Rollout:
    __slots__ = ("loop", "stalled", "started", "timer")

    def __init__(self, loop: RetryLoop, started: float) -> None:
        self.loop = loop
        self.started = started  # monotonic
        self.stalled = False
        self.timer: asyncio.TimerHandle | threading.Timer | None = None


class RolloutsInFlight:
    """The rollouts whose ``/run`` has not answered, for the gauges and the stall check."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._items: set[_Rollout] = set()
        self._lock = threading.Lock()

    def start(self, loop: RetryLoop, stalled_after: float | None = None) -> _Rollout:
        """A rollout's ``/run`` went out in ``loop``: in flight until ``end``; stalled, once,
        ``stalled_after`` seconds later (default: ``NG_OTEL_STALL_SECONDS``)."""
        entry = _Rollout(loop, self._clock())
        with self._lock:
            self._items.add(entry)
        recorder = get_recorder()
        instruments(recorder)  # the gauges exist from the first rollout on
        seconds = stalled_after if stalled_after is not None else recorder.settings.stall_seconds
        try:
            entry.timer = asyncio.get_running_loop().call_later(seconds, self.check, entry)
        except RuntimeError:  # no event loop here: a thread's timer does it
            timer = threading.Timer(seconds, self.check, (entry,))
            timer.daemon = True
            timer.start()
            entry.timer = timer
        loop.rollout = entry
        return entry

    def end(self, entry: _Rollout) -> None:
        with self._lock:
            self._items.discard(entry)
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None

    @guarded
    def check(self, entry: _Rollout) -> None:
        """Past the stall age: the rollout, if still in flight, is stalled (one event)."""
        with self._lock:
            if entry not in self._items or entry.stalled:
                return
            entry.stalled = True
        if is_enabled():
            record_stalled(entry.loop, self._clock() - entry.started)

    def ages(self) -> list[float]:
        now = self._clock()
        with self._lock:
            return [now - entry.started for entry in self._items]

    def observe_count(self) -> list[Observation]:
        with self._lock:
            return [Observation(len(self._items))]

    def observe_oldest(self) -> list[Observation]:
        ages = self.ages()
        return [Observation(round(max(ages), 3) if ages else 0.0)]

    def observe_stalled(self) -> list[Observation]:
        with self._lock:
            return [Observation(sum(1 for entry in self._items if entry.stalled))]


def record_stalled(loop: RetryLoop, age: float) -> None:
    """The ``ng.failure`` event of a rollout in flight for ``age`` seconds: ``agent_timeout``
    at ``collection``, recovered (it may yet answer), on a short span in the rollout's trace."""
    seconds = get_recorder().settings.stall_seconds
    reason = f"rollout in flight for {age:.1f} s without its /run reply (stalled past {seconds:g} s)"
    event = NgFailureEvent(STALLED_KIND, reason, boundary=STALLED_BOUNDARY, stage="agent", operation="run")
    report = FailureReport._trusted({event.event_id: event.to_record()})
    where = NonRecordingSpan(loop.span_context or INVALID_SPAN_CONTEXT)
    attributes = {names.ROLLOUT_STALLED: True, names.ROLLOUT_AGE: round(age, 3)}
    get_recorder().record(report, where, own=False, recovered=True, event_attributes=attributes)


_in_flight = RolloutsInFlight()


def in_flight() -> RolloutsInFlight:
    """The process's rollouts in flight."""
    return _in_flight


def set_in_flight(registry: RolloutsInFlight) -> RolloutsInFlight:
    """Use ``registry`` from now on and return the one it replaces (tests)."""
    global _in_flight
    previous, _in_flight = _in_flight, registry
    return previous


# -- the attempt that ended a loop, on the exception the loop raised ------------------------------

_LAST_ATTEMPT: Final = "_ng_otel_last_attempt"


def keep_last_attempt(error: BaseException, report: FailureReport) -> None:
    """Keep ``report`` (the event of the attempt that ended a loop) on the ``error`` the loop
    raises, so the failure raised for it is caused by (and links to) that event."""
    try:
        setattr(error, _LAST_ATTEMPT, report)
    except (AttributeError, TypeError):  # an exception type with slots: no link, nothing lost
        pass


def last_attempt_of(error: BaseException) -> FailureReport | None:
    """The event of the attempt that ended a loop by raising ``error``, if one was kept."""
    report = error.__dict__.get(_LAST_ATTEMPT) if hasattr(error, "__dict__") else None
    return report if isinstance(report, FailureReport) else None
