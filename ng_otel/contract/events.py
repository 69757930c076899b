"""``NgFailureEvent``: the one exception a Gym boundary raises and the record it serializes.

As NeMo Gym Main's "Failure observations" documentation describes it. There are no
boundary-specific subclasses: callers catch ``NgFailureEvent`` and select by ``boundary``,
``failure_kind`` and ``operation``. Only the explicit chain (``raise ... from``) makes causes;
``__context__`` never does. An exception of another class that follows the same documented API
(``is_gym_failure``) is a Gym event in every chain walked here.
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, Protocol, cast

from pydantic import ConfigDict, Field, StrictInt, StrictStr, TypeAdapter, ValidationError
from typing_extensions import NotRequired, TypedDict

from ng_otel.contract.kinds import KIND_PATTERN, MAX_KIND_CHARS, is_well_formed, validate_failure_kind

Boundary = Literal["model", "harness", "agent", "resources_server", "environment", "collection"]
Stage = Literal["admission", "seed", "agent", "verification", "cleanup"]
BOUNDARIES: Final[tuple[str, ...]] = ("model", "harness", "agent", "resources_server", "environment", "collection")
STAGES: Final[tuple[str, ...]] = ("admission", "seed", "agent", "verification", "cleanup")

MAX_REASON_CHARS: Final = 2000
"""Bound on ``failure_reason`` and ``foreign_error.message``; the marker counts inside it."""
TRUNCATION_MARKER: Final = "...[truncated]"
MAX_ID_CHARS: Final = 128
ID_PATTERN: Final = rf"^[A-Za-z0-9._:-]{{1,{MAX_ID_CHARS}}}$"
MAX_OPERATION_CHARS: Final = 128
MAX_TYPE_CHARS: Final = 256
HTTP_STATUS_MIN: Final = 100
HTTP_STATUS_MAX: Final = 599

EVENT_ID_RE: Final = re.compile(ID_PATTERN)  # what an event id, and a cause id, may be
OPERATION_PATTERN: Final = rf"^[A-Za-z0-9._:/-]{{1,{MAX_OPERATION_CHARS}}}$"
OPERATION_RE: Final = re.compile(OPERATION_PATTERN)  # what an operation may be

_Status = Annotated[StrictInt, Field(ge=HTTP_STATUS_MIN, le=HTTP_STATUS_MAX)]
_Id = Annotated[StrictStr, Field(pattern=ID_PATTERN)]


# Readers are tolerant: a key this version does not know (Gym Main documents details beside an
# event's fields) is dropped on decode, never exported or forwarded; known fields stay strict.
READ_CONFIG: Final = ConfigDict(extra="ignore", strict=True)


class ForeignErrorRecord(TypedDict):
    __pydantic_config__ = READ_CONFIG  # type: ignore[misc]
    type: Annotated[StrictStr, Field(min_length=1, max_length=MAX_TYPE_CHARS)]
    message: Annotated[StrictStr, Field(max_length=MAX_REASON_CHARS)]
    http_status: NotRequired[_Status]


class FailureRecord(TypedDict):
    """The wire form of one event (``to_record()``); absent evidence is an absent key."""

    __pydantic_config__ = READ_CONFIG  # type: ignore[misc]
    event_id: _Id
    boundary: Boundary
    failure_kind: Annotated[StrictStr, Field(max_length=MAX_KIND_CHARS, pattern=KIND_PATTERN)]
    failure_reason: Annotated[StrictStr, Field(max_length=MAX_REASON_CHARS)]
    stage: NotRequired[Stage]
    http_status: NotRequired[_Status]
    operation: NotRequired[Annotated[StrictStr, Field(pattern=OPERATION_PATTERN)]]
    cause_id: NotRequired[_Id]
    foreign_error: NotRequired[ForeignErrorRecord]


RECORD_ADAPTER: Final = TypeAdapter(FailureRecord)
REQUIRED_RECORD_KEYS: Final = frozenset({"event_id", "boundary", "failure_kind", "failure_reason"})
"""The fields every record has (``FailureRecord``'s required ones; a test holds them together)."""


def bound_text(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """Cut ``text`` to ``limit`` characters, ending with the visible truncation marker."""
    if len(text) <= limit:
        return text
    return text[: limit - len(TRUNCATION_MARKER)] + TRUNCATION_MARKER


def describe_validation_error(error: ValidationError, what: str) -> str:
    """A one-line message naming each bad field, without echoing (possibly hostile) input."""
    parts = []
    for item in error.errors(include_input=False, include_url=False)[:5]:
        loc = ".".join(_printable(str(p)[:MAX_ID_CHARS]) for p in item["loc"]) or "<root>"
        parts.append(f"{loc}: {item['msg']}")
    more = error.error_count() - len(parts)
    return f"invalid {what}: " + "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def _printable(text: str) -> str:
    return "".join(c if " " <= c <= "~" else "?" for c in text)


@dataclass(frozen=True)
class ForeignError:
    """Facts an adapter selected from a third-party SDK error: never the SDK object itself."""

    type: str
    message: str
    http_status: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not 0 < len(self.type) <= MAX_TYPE_CHARS:
            raise ValueError(f"foreign_error.type: a name of 1-{MAX_TYPE_CHARS} chars is required")
        if not isinstance(self.message, str):
            raise ValueError("foreign_error.message: must be a string")
        _check_status(self.http_status, "foreign_error.http_status")
        object.__setattr__(self, "message", bound_text(self.message))

    @classmethod
    def from_exception(cls, error: BaseException) -> ForeignError:
        """Select type name, bounded message and HTTP status (``status_code``, ``status`` or
        ``http_status``, whichever is an int in 100-599) from any exception."""
        kind = type(error)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        try:
            message = str(error)
        except Exception:  # a broken __str__ must not cost us the event
            message = f"<unprintable {kind.__name__}>"
        status = None
        for attr in ("status_code", "status", "http_status"):
            try:
                value = getattr(error, attr, None)
            except Exception:  # a property of a third-party error that raises: no status from it
                continue
            if is_http_status(value):
                status = value
                break
        return cls(type=name[:MAX_TYPE_CHARS], message=message, http_status=status)

    def to_record(self) -> dict[str, Any]:
        """``{"type", "message", "http_status"?}`` as a record's ``foreign_error``."""
        record: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.http_status is not None:
            record["http_status"] = self.http_status
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ForeignError:
        """The inverse of ``to_record`` (validated like the constructor)."""
        return cls(record["type"], record["message"], record.get("http_status"))


def is_http_status(value: object) -> bool:
    """An HTTP status a record may carry: an int (not a bool) in 100-599."""
    return type(value) is int and HTTP_STATUS_MIN <= value <= HTTP_STATUS_MAX


def _check_status(value: object, field: str) -> None:
    if value is not None and not is_http_status(value):
        raise ValueError(f"{field}: must be an int in {HTTP_STATUS_MIN}-{HTTP_STATUS_MAX}")


def new_event_id() -> str:
    return uuid.uuid4().hex


class NgFailureEvent(Exception):
    """One observed failure, raised at the boundary that saw it (``raise NgFailureEvent(...) from err``).

    The event id is assigned here. The cause is whatever Gym event the explicit ``__cause__``
    chain reaches first, through foreign exceptions; the nearest foreign exception below this
    event supplies ``foreign_error`` unless one was given.
    """

    event_id: str
    failure_kind: str
    failure_reason: str
    boundary: str
    stage: str | None
    http_status: int | None
    operation: str | None
    http_error: Any  # set by transport adapters: this hop's own status and body
    recorded_at: Mapping[str, str] | None
    """Where events of this chain were recorded, set by an adapter before the failure crosses a
    process by pickle (Ray): event id -> ``<32 hex trace id>-<16 hex span id>``, the
    ``X-NG-Failure-Context`` encoding. Pickled with the chain; never part of a record."""

    def __init__(
        self,
        failure_kind: str,
        failure_reason: str,
        *,
        boundary: str,
        stage: str | None = None,
        http_status: int | None = None,
        operation: str | None = None,
        foreign_error: ForeignError | None = None,
    ) -> None:
        if boundary not in BOUNDARIES:
            raise ValueError(f"boundary: must be one of {', '.join(BOUNDARIES)}")
        if not is_well_formed(failure_kind):
            raise ValueError("failure_kind: must be <domain>_<condition> or <server>:<kind>")
        if not isinstance(failure_reason, str):
            raise ValueError("failure_reason: must be a string")
        if stage is not None and stage not in STAGES:
            raise ValueError(f"stage: must be one of {', '.join(STAGES)}")
        _check_status(http_status, "http_status")
        if operation is not None and (not isinstance(operation, str) or not OPERATION_RE.fullmatch(operation)):
            raise ValueError(f"operation: must be 1-{MAX_OPERATION_CHARS} chars of [A-Za-z0-9._:/-]")
        if foreign_error is not None and not isinstance(foreign_error, ForeignError):
            raise ValueError("foreign_error: must be a ForeignError")
        validate_failure_kind(failure_kind)
        failure_reason = bound_text(failure_reason)
        super().__init__(failure_kind, failure_reason)
        self.event_id = new_event_id()
        self.failure_kind = failure_kind
        self.failure_reason = failure_reason
        self.boundary = boundary
        self.stage = stage
        self.http_status = http_status
        self.operation = operation
        self._foreign_error = foreign_error
        self._recorded_cause_id: str | None = None
        self.http_error = None
        self.recorded_at = None

    def __str__(self) -> str:
        return f"{self.failure_kind}: {self.failure_reason}"

    def __repr__(self) -> str:
        return f"NgFailureEvent({self.failure_kind!r}, boundary={self.boundary!r}, event_id={self.event_id!r})"

    @property
    def cause(self) -> GymFailure | None:
        """The nearest Gym event in the explicit chain below this one (ours or one following
        the same API)."""
        return _next_gym_event(self)[1]

    @property
    def cause_id(self) -> str | None:
        """The event id of the explicit cause (or the one a decoded record named)."""
        cause = _next_gym_event(self)[0]
        return cause.event_id if cause is not None else self._recorded_cause_id

    @property
    def foreign_error(self) -> ForeignError | None:
        """The given one, or facts from the nearest foreign exception below this event."""
        if self._foreign_error is not None:
            return self._foreign_error
        foreign = _next_gym_event(self)[2]
        return ForeignError.from_exception(foreign) if foreign is not None else None

    def to_record(self) -> dict[str, Any]:
        """The record of the contract, keys with no value left out."""
        cause, _, foreign = _next_gym_event(self)
        cause_id = cause.event_id if cause is not None else self._recorded_cause_id
        return self._record(cause_id, _foreign_of(self, foreign))

    def _record(self, cause_id: str | None, foreign_error: ForeignError | None) -> dict[str, Any]:
        record: dict[str, Any] = {
            "event_id": self.event_id,
            "boundary": self.boundary,
            "failure_kind": self.failure_kind,
            "failure_reason": self.failure_reason,
        }
        if self.stage is not None:
            record["stage"] = self.stage
        if self.http_status is not None:
            record["http_status"] = self.http_status
        if self.operation is not None:
            record["operation"] = self.operation
        if cause_id is not None:
            record["cause_id"] = cause_id
        if foreign_error is not None:
            record["foreign_error"] = foreign_error.to_record()
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NgFailureEvent:
        """Rebuild an event from its record, ids kept. Raises ``ValueError`` naming the field."""
        try:
            valid = RECORD_ADAPTER.validate_python(record)
        except ValidationError as error:
            raise ValueError(describe_validation_error(error, "failure record")) from None
        validate_failure_kind(valid["failure_kind"])
        return cls._from_valid_record(valid)

    @classmethod
    def _from_valid_record(cls, record: Mapping[str, Any]) -> NgFailureEvent:
        event = cls.__new__(cls)
        Exception.__init__(event, record["failure_kind"], record["failure_reason"])
        event.event_id = record["event_id"]
        event.failure_kind = record["failure_kind"]
        event.failure_reason = record["failure_reason"]
        event.boundary = record["boundary"]
        event.stage = record.get("stage")
        event.http_status = record.get("http_status")
        event.operation = record.get("operation")
        foreign = record.get("foreign_error")
        event._foreign_error = ForeignError.from_record(foreign) if foreign is not None else None
        event._recorded_cause_id = record.get("cause_id")
        event.http_error = None
        event.recorded_at = None
        return event

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle the explicit Gym chain as flat records (no recursion on deep chains);
        # the traceback and foreign objects are not picklable facts, foreign_error is.
        records = tuple(gym_chain_records(self))
        recorded_at = getattr(self, "recorded_at", None)
        if recorded_at:
            return (_unpickle_chain, (records, dict(recorded_at)))
        return (_unpickle_chain, (records,))


def _unpickle_chain(
    records: tuple[dict[str, Any], ...], recorded_at: Mapping[str, str] | None = None
) -> NgFailureEvent:
    event = link_records(records)
    if recorded_at:
        ids = {record["event_id"] for record in records}
        # Plain strings of this chain's events only; the otel side validates their form.
        event.recorded_at = {
            key: value for key, value in recorded_at.items() if key in ids and isinstance(value, str)
        } or None
    return event


def link_records(records: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> NgFailureEvent:
    """Rebuild a chain from records ordered effect first; each event's ``__cause__`` is the next."""
    events = [NgFailureEvent._from_valid_record(record) for record in records]
    for effect, cause in itertools.pairwise(events):
        effect.__cause__ = cause
    return events[0]


def walk_explicit_chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and its ``__cause__`` chain, each exception once (a cycle ends the walk)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__


class GymFailure(Protocol):
    """What Gym Main documents of ``NgFailureEvent``: any exception with these is a Gym event."""

    @property
    def event_id(self) -> str: ...
    @property
    def failure_kind(self) -> str: ...
    @property
    def boundary(self) -> str: ...
    @property
    def cause_id(self) -> str | None: ...
    def to_record(self) -> Mapping[str, Any]: ...


_GYM_API: Final = ("event_id", "failure_kind", "boundary", "cause_id")


def is_gym_failure(error: object) -> bool:
    """True for an ``NgFailureEvent`` or any exception following its documented API
    (``to_record()``, ``event_id``, ``failure_kind``, ``boundary``, ``cause_id``): Gym's own
    class, or another package's. Never raises."""
    if isinstance(error, NgFailureEvent):
        return True
    if not isinstance(error, BaseException):
        return False
    try:
        return callable(getattr(error, "to_record", None)) and all(hasattr(error, name) for name in _GYM_API)
    except Exception:  # a hostile __getattr__ makes it a foreign exception, never our error
        return False


def gym_event_view(error: BaseException) -> NgFailureEvent | None:
    """``error`` as an ``NgFailureEvent``: itself when it is one; for another class following
    the API, an event decoded from its ``to_record()`` (unknown keys dropped, known fields
    validated); ``None`` for a foreign exception, including one whose record is invalid."""
    if isinstance(error, NgFailureEvent):
        return error
    if not is_gym_failure(error):
        return None
    try:
        valid = RECORD_ADAPTER.validate_python(cast(GymFailure, error).to_record())
    except Exception:  # invalid or raising to_record(): a foreign exception, not our caller's error
        return None
    validate_failure_kind(valid["failure_kind"])
    return NgFailureEvent._from_valid_record(valid)


def _next_gym_event(
    event: BaseException,
) -> tuple[NgFailureEvent | None, GymFailure | None, BaseException | None]:
    """(nearest Gym event below ``event`` as an ``NgFailureEvent``, that exception itself, the
    nearest foreign exception between them)."""
    foreign: BaseException | None = None
    chain = walk_explicit_chain(event)
    next(chain)
    for error in chain:
        view = gym_event_view(error)
        if view is not None:
            return view, cast(GymFailure, error), foreign
        if foreign is None:
            foreign = error
    return None, None, foreign


def gym_chain_records(error: BaseException) -> list[dict[str, Any]]:
    """Records of the Gym events in ``error``'s explicit chain, effect first, in one pass.

    Each event's ``cause_id`` is the next Gym event; a foreign exception supplies the
    ``foreign_error`` of the nearest Gym event above it; foreign exceptions above every Gym
    event are dropped (there is no boundary to attribute them to). An exception following
    ``NgFailureEvent``'s API counts as a Gym event (``gym_event_view``).
    """
    records: list[dict[str, Any]] = []
    pending: NgFailureEvent | None = None
    foreign: BaseException | None = None
    for current in walk_explicit_chain(error):
        view = gym_event_view(current)
        if view is not None:
            if pending is not None:
                records.append(pending._record(view.event_id, _foreign_of(pending, foreign)))
            pending, foreign = view, None
        elif pending is not None and foreign is None:
            foreign = current
    if pending is not None:
        records.append(pending._record(pending._recorded_cause_id, _foreign_of(pending, foreign)))
    return records


def _foreign_of(event: NgFailureEvent, foreign: BaseException | None) -> ForeignError | None:
    if event._foreign_error is not None:
        return event._foreign_error
    return ForeignError.from_exception(foreign) if foreign is not None else None
