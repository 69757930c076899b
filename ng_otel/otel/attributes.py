"""A failure record as the attributes of its ``ng.failure`` event, and back: the one codec,
written from ``names.RECORD_ATTRIBUTES`` and ``names.FOREIGN_ATTRIBUTES``. The recorder writes
events through it; the after-the-run readers (``ng_otel.runs``) read OTLP JSON through it, so
they see every field the event holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ng_otel.otel import names

_FLAT = names.RECORD_ATTRIBUTES
_FOREIGN = names.FOREIGN_ATTRIBUTES


def event_attributes(record: Mapping[str, Any]) -> dict[str, Any]:
    """The event attributes of ``record`` (a ``FailureRecord``): each field it holds, under
    its attribute name (``recovered`` and ``class`` are the recorder's to add)."""
    # Loops, not comprehensions: a comprehension is a call of its own, and this runs per event.
    attributes: dict[str, Any] = {}
    get = record.get
    for key, attribute in _FLAT:
        value = get(key)
        if value is not None:
            attributes[attribute] = value
    foreign = get("foreign_error")
    if foreign is not None:
        get = foreign.get
        for key, attribute in _FOREIGN:
            value = get(key)
            if value is not None:
                attributes[attribute] = value
    return attributes


def record_of(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The record an event's attributes hold (read from OTLP JSON, so of any type): every field
    ``event_attributes`` writes, and ``recovered``. A cause id that is not a string is no cause
    (a cause id is a dict key and a set member from here on); the id, boundary and kind are
    the caller's to have checked."""
    record: dict[str, Any] = {key: attributes[attribute] for key, attribute in _FLAT if attribute in attributes}
    record["event_id"], record["boundary"] = str(record["event_id"]), str(record["boundary"])
    record["failure_kind"] = str(record["failure_kind"])
    record["failure_reason"] = str(record.get("failure_reason", ""))
    if not isinstance(record.get("cause_id", ""), str):
        del record["cause_id"]
    if isinstance(attributes.get(names.FOREIGN_TYPE), str):
        record["foreign_error"] = {key: attributes[attribute] for key, attribute in _FOREIGN if attribute in attributes}
    record["recovered"] = attributes.get(names.RECOVERED) is True
    return record
