"""``FailureReport``: every failure a reply knows of, keyed by event id.

As NeMo Gym Main's "Failure observations" documentation describes it. A report holds the
request's own chain (``failure_id`` names its top), failures recovered while serving the
request, and events forwarded by downstream Gym replies, ids preserved. It is validated whole
on decode: keys match ids, every ``cause_id`` resolves inside it, and causes form no cycle.
The reader is tolerant: keys it does not know, at the top or inside an event, are dropped
(never exported, never forwarded as ours); only an invalid known field rejects the report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Annotated, Any, Final, cast

from pydantic import Field, StrictBool, TypeAdapter, ValidationError
from typing_extensions import NotRequired, TypedDict

from ng_otel.contract.events import (
    ID_PATTERN,
    READ_CONFIG,
    FailureRecord,
    GymFailure,
    NgFailureEvent,
    describe_validation_error,
    gym_chain_records,
    gym_event_view,
    link_records,
    walk_explicit_chain,
)
from ng_otel.contract.header import (
    OMITTED_VALUE,
    REPORT_HEADER,
    check_header_value,
    encode_header_json,
)
from ng_otel.contract.kinds import validate_failure_kind

MAX_REPORT_EVENTS: Final = 10_000
"""Most events one report may hold when decoded from a dict (a header is bounded by size)."""

_Id = Annotated[str, Field(pattern=ID_PATTERN)]


class _ReportPayload(TypedDict):
    __pydantic_config__ = READ_CONFIG  # type: ignore[misc]
    failure_id: NotRequired[_Id]
    events: NotRequired[Annotated[dict[_Id, FailureRecord], Field(max_length=MAX_REPORT_EVENTS)]]
    omitted: NotRequired[StrictBool]


_PAYLOAD_ADAPTER: Final = TypeAdapter(_ReportPayload)
_EMPTY: Mapping[str, Mapping[str, Any]] = MappingProxyType({})


class FailureReport:
    """An immutable, validated set of failure records for one reply."""

    __slots__ = ("events", "failure_id", "omitted")
    failure_id: str | None
    events: Mapping[str, Mapping[str, Any]]
    omitted: bool

    def __init__(
        self,
        events: Mapping[str, Mapping[str, Any]] | None = None,
        failure_id: str | None = None,
        omitted: bool = False,
    ) -> None:
        """Validate and build; raises ``ValueError`` naming the field that is wrong."""
        payload: dict[str, Any] = {"events": dict(events or {}), "omitted": omitted}
        if failure_id is not None:
            payload["failure_id"] = failure_id
        valid = _validated(lambda: _PAYLOAD_ADAPTER.validate_python(payload))
        checked = self._from_payload(valid)
        self._set(checked.events, checked.failure_id, checked.omitted)

    def _set(self, events: Mapping[str, Mapping[str, Any]], failure_id: str | None, omitted: bool) -> None:
        # The slots' own setters, cheaper than object.__setattr__: summary builds one a row
        _set_events(self, MappingProxyType(events) if events else _EMPTY)
        _set_failure_id(self, failure_id)
        _set_omitted(self, omitted)

    @classmethod
    def _trusted(
        cls, events: Mapping[str, Mapping[str, Any]], failure_id: str | None = None, omitted: bool = False
    ) -> FailureReport:
        """Build from records this package produced or already validated."""
        report = cls.__new__(cls)
        report._set(events, failure_id, omitted)
        return report

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("FailureReport is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FailureReport):
            return NotImplemented
        return (self.failure_id, dict(self.events), self.omitted) == (
            other.failure_id,
            dict(other.events),
            other.omitted,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"FailureReport(failure_id={self.failure_id!r}, events={len(self.events)}, omitted={self.omitted})"

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return iter(self.events.values())

    # -- dict and header forms ---------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data (``from_dict`` reverses it)."""
        data: dict[str, Any] = {}
        if self.failure_id is not None:
            data["failure_id"] = self.failure_id
        data["events"] = {event_id: dict(record) for event_id, record in self.events.items()}
        if self.omitted:
            data["omitted"] = True
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FailureReport:
        """Validate a decoded report, dropping keys it does not know; raises ``ValueError``
        naming the known field that is wrong."""
        valid = _validated(lambda: _PAYLOAD_ADAPTER.validate_python(data))
        return cls._from_payload(valid)

    def to_header(self) -> str:
        """The ``X-NG-Failure-Report`` value: compact ASCII JSON, or ``{"omitted":true}`` when
        the encoding exceeds 4096 bytes."""
        data: dict[str, Any] = {}
        if self.failure_id is not None:
            data["failure_id"] = self.failure_id
        data["events"] = dict(self.events)  # the encoder takes a dict, not a mapping proxy
        if self.omitted:
            data["omitted"] = True
        return encode_header_json(data) or OMITTED_VALUE

    @classmethod
    def from_header(cls, value: str | bytes) -> FailureReport:
        """Decode and validate a header value (unknown keys dropped); raises ``ValueError``
        naming what is wrong."""
        text = check_header_value(value, REPORT_HEADER)
        valid = _validated(lambda: _PAYLOAD_ADAPTER.validate_json(text))
        return cls._from_payload(valid)

    @classmethod
    def _from_payload(cls, valid: Mapping[str, Any]) -> FailureReport:
        events: dict[str, Mapping[str, Any]] = valid.get("events", {})
        failure_id = valid.get("failure_id")
        for event_id, record in events.items():
            if record["event_id"] != event_id:
                raise ValueError(f"invalid failure report: events.{event_id}: key differs from its event_id")
            cause_id = record.get("cause_id")
            if cause_id is not None and cause_id not in events:
                raise ValueError(f"invalid failure report: events.{event_id}.cause_id: {cause_id} is not in the report")
            validate_failure_kind(record["failure_kind"])
        if failure_id is not None and failure_id not in events:
            raise ValueError(f"invalid failure report: failure_id: {failure_id} is not in the report")
        _check_acyclic(events)
        return cls._trusted(events, failure_id, valid.get("omitted", False))

    # -- operations ----------------------------------------------------------------------

    def merge(self, other: FailureReport) -> FailureReport:
        """This report plus ``other``'s events (ids kept, this side wins on a repeated id).

        ``failure_id`` stays this report's own: a forwarded or recovered failure never becomes
        the reply's failure. The omitted flag is kept from either side.
        """
        if not other.events and not other.omitted:
            return self
        # Both sides are closed under cause_id, so the union is closed and acyclic too.
        events = dict(self.events)
        for event_id, record in other.events.items():
            events.setdefault(event_id, record)
        return FailureReport._trusted(events, self.failure_id, self.omitted or other.omitted)

    def chain(self, event_id: str | None = None) -> list[Mapping[str, Any]]:
        """Records from ``event_id`` (default: ``failure_id``) down its causes, effect first."""
        current = self.failure_id if event_id is None else event_id
        if current is None:
            return []
        if current not in self.events:
            raise KeyError(current)
        records = []
        while current is not None:
            record = self.events[current]
            records.append(record)
            current = record.get("cause_id")
        return records

    def recovered_ids(self) -> frozenset[str]:
        """Events not on the causal chain of the reply's own failure."""
        chain = self.chain()
        if len(chain) == len(self.events):
            return _NONE_RECOVERED  # the usual report, one chain: its events are distinct, so all of them
        on_chain = {record["event_id"] for record in chain}
        return frozenset(event_id for event_id in self.events if event_id not in on_chain)


def _slot_setter(name: str) -> Callable[[FailureReport, Any], None]:
    """The ``__set__`` of a ``FailureReport`` slot's member descriptor."""
    setter: Callable[[FailureReport, Any], None] = vars(FailureReport)[name].__set__
    return setter


_set_events: Final = _slot_setter("events")
_set_failure_id: Final = _slot_setter("failure_id")
_set_omitted: Final = _slot_setter("omitted")


_NONE_RECOVERED: frozenset[str] = frozenset()


def _validated(validate: Any) -> Any:
    try:
        return validate()
    except ValidationError as error:
        raise ValueError(describe_validation_error(error, "failure report")) from None


def _check_acyclic(events: Mapping[str, Mapping[str, Any]]) -> None:
    # Each event has at most one cause, so following pointers once per event is O(n).
    done: set[str] = set()
    for start in events:
        if start in done:
            continue  # on a chain already followed (the usual case: effect first, then causes)
        path: set[str] = set()
        current: str | None = start
        while current is not None and current not in done:
            if current in path:
                raise ValueError("invalid failure report: events: cause_id links form a cycle")
            path.add(current)
            current = events[current].get("cause_id")
        done |= path


def failure_report_for(error: BaseException) -> FailureReport | None:
    """The report of ``error``'s explicit ``__cause__`` chain, or ``None`` when no Gym event
    is in it. ``failure_id`` is the first Gym event; implicit context is never followed. An
    exception of another class that follows ``NgFailureEvent``'s API is a Gym event too."""
    records = gym_chain_records(error)
    if not records:
        return None
    events: dict[str, dict[str, Any]] = {}
    for record in records:
        if record["event_id"] in events:
            break  # the same id again: the chain loops back, so it ends here
        events[record["event_id"]] = record
    # Each kept record's cause is the next one, except the last kept: its cause id either loops
    # back or was remembered from a decoded record whose cause is not in this chain. Only the
    # explicit chain makes causes, so it is not reported.
    last_kept = records[len(events) - 1]
    last_kept.pop("cause_id", None)
    return FailureReport._trusted(events, records[0]["event_id"])


def rebuild_failure(report: FailureReport) -> NgFailureEvent | None:
    """The reply's own failure rebuilt from ``report``, ids kept, causes as ``__cause__``."""
    chain = report.chain()
    if not chain:
        return None
    return link_records([dict(record) for record in chain])


def find_boundary_failure(error: BaseException) -> GymFailure | None:
    """The first Gym event in ``error``'s explicit chain, ``error`` included: an
    ``NgFailureEvent``, or an exception of another class following its API whose record is
    valid (returned as itself)."""
    for current in walk_explicit_chain(error):
        if gym_event_view(current) is not None:
            return cast(GymFailure, current)
    return None
