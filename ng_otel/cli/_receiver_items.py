"""Counting what an OTLP request holds before it is parsed.

Bytes are a poor measure of what a request costs: an empty span is 2 bytes on the wire and
about 90 once protobuf has parsed it, and several hundred more once it is a dict and a JSON
line. So the receiver walks the protobuf wire format first, without building anything, and
counts spans, events, links, attributes and every value (each field on the wire, each
element of a packed field); a request over a bound is refused before anything is decoded
from it. The walk stops at the first bound passed, so it costs at most the bounds, never the
body's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from google.protobuf.descriptor import Descriptor, FieldDescriptor

# Enough for a Collector's batch (its batch processor sends 8,192 spans) of spans at the
# SDK's limits on events and links (128 each), with room to spare; each costs a few hundred
# bytes once decoded, and the receiver's memory is the bound times that.
MAX_SPANS_PER_REQUEST: Final = 100_000
MAX_EVENTS_PER_REQUEST: Final = 100_000
MAX_LINKS_PER_REQUEST: Final = 100_000
MAX_ATTRIBUTES_PER_REQUEST: Final = 250_000  # key-value pairs, at any depth (kvlists too)
# Every field on the wire and every element of a packed field, whatever it is: what bounds
# the empty resource and scope wrappers, data points, log records and array elements too.
MAX_VALUES_PER_REQUEST: Final = 500_000

_KINDS: Final = {
    "opentelemetry.proto.trace.v1.Span": "spans",
    "opentelemetry.proto.trace.v1.Span.Event": "events",
    "opentelemetry.proto.trace.v1.Span.Link": "links",
    "opentelemetry.proto.common.v1.KeyValue": "attributes",
}
_HIGH_BYTES: Final = bytes(range(0x80, 0x100))  # a varint's continuation bytes
_FIXED_SIZES: Final = {
    FieldDescriptor.TYPE_DOUBLE: 8,
    FieldDescriptor.TYPE_FIXED64: 8,
    FieldDescriptor.TYPE_SFIXED64: 8,
    FieldDescriptor.TYPE_FLOAT: 4,
    FieldDescriptor.TYPE_FIXED32: 4,
    FieldDescriptor.TYPE_SFIXED32: 4,
}
_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


@dataclass(frozen=True)
class ItemLimits:
    """What one request may hold; the defaults are the module's constants."""

    spans: int = MAX_SPANS_PER_REQUEST
    events: int = MAX_EVENTS_PER_REQUEST
    links: int = MAX_LINKS_PER_REQUEST
    attributes: int = MAX_ATTRIBUTES_PER_REQUEST
    values: int = MAX_VALUES_PER_REQUEST


class TooManyItems(Exception):
    """A request over one of its ``ItemLimits``."""

    def __init__(self, kind: str, limit: int) -> None:
        super().__init__(f"request holds more than {limit} {kind}")
        self.kind = kind
        self.limit = limit


class NotProtobuf(ValueError):
    """Bytes that are not the protobuf wire format."""


# Per message type: field number -> (the field's message type or None, packed element size:
# 0 for a packed varint, None for a field that is never packed).
_Fields = dict[int, tuple[Descriptor | None, int | None]]
_TABLES: dict[str, _Fields] = {}


def _fields(descriptor: Descriptor) -> _Fields:
    table = _TABLES.get(descriptor.full_name)
    if table is None:
        table = {}
        for item in descriptor.fields:
            packable = item.is_repeated and item.message_type is None and item.type not in _UNPACKABLE
            table[item.number] = (item.message_type, _FIXED_SIZES.get(item.type, 0) if packable else None)
        _TABLES[descriptor.full_name] = table
    return table


_UNPACKABLE: Final = frozenset({FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES})


def count_items(body: bytes, message_type: Descriptor, limits: ItemLimits) -> dict[str, int]:
    """The spans, events, links, attributes and values ``body`` holds, as a ``message_type``.
    Raises ``TooManyItems`` at the first bound passed and ``NotProtobuf`` for bytes that are
    not the wire format (a group, a length past the end)."""
    counts = {"spans": 0, "events": 0, "links": 0, "attributes": 0, "values": 0}
    bounds = {kind: getattr(limits, kind) for kind in counts}
    values = 0
    values_limit = limits.values
    stack: list[tuple[int, int, Descriptor]] = [(0, len(body), message_type)]
    while stack:
        position, end, descriptor = stack.pop()
        table = _fields(descriptor)
        while position < end:
            tag, position = _varint(body, position, end)
            number, wire_type = tag >> 3, tag & 7
            values += 1
            if values > values_limit:
                raise TooManyItems("values", values_limit)
            if wire_type == _VARINT:
                _, position = _varint(body, position, end)
            elif wire_type == _FIXED64:
                position += 8
            elif wire_type == _FIXED32:
                position += 4
            elif wire_type == _LENGTH_DELIMITED:
                size, position = _varint(body, position, end)
                start, position = position, position + size
                if position > end:
                    raise NotProtobuf("a length runs past the end of its message")
                child, packed = table.get(number, (None, None))
                if child is not None:
                    kind = _KINDS.get(child.full_name)
                    if kind is not None:
                        counts[kind] += 1
                        if counts[kind] > bounds[kind]:
                            raise TooManyItems(kind, bounds[kind])
                    stack.append((start, position, child))
                elif packed is not None:
                    elements = size // packed if packed else len(body[start:position].translate(None, _HIGH_BYTES))
                    values += max(elements - 1, 0)  # the field itself was counted above
                    if values > values_limit:
                        raise TooManyItems("values", values_limit)
            else:
                raise NotProtobuf(f"wire type {wire_type} (a group, or not protobuf)")
            if position > end:
                raise NotProtobuf("a field runs past the end of its message")
    counts["values"] = values
    return counts


def _varint(body: bytes, position: int, end: int) -> tuple[int, int]:
    if position < end:
        byte = body[position]
        if byte < 0x80:
            return byte, position + 1
    result = shift = 0
    while position < end and shift < 70:
        byte = body[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
    raise NotProtobuf("a varint is cut short or too long")


__all__ = [
    "MAX_ATTRIBUTES_PER_REQUEST",
    "MAX_EVENTS_PER_REQUEST",
    "MAX_LINKS_PER_REQUEST",
    "MAX_SPANS_PER_REQUEST",
    "MAX_VALUES_PER_REQUEST",
    "ItemLimits",
    "NotProtobuf",
    "TooManyItems",
    "count_items",
]
