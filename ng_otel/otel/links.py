"""Where each failure event was recorded: the span contexts that cause links point at.

A process remembers, for a bounded number of event ids, the span context on which the event
was recorded, here or (learned from ``X-NG-Failure-Context``) in a callee. Knowing an id also
means it was exported already, which is what keeps every event exported exactly once.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, TraceFlags

from ng_otel._compat import PlainSpanContext, plain_span_context, span_context_of
from ng_otel.contract.events import EVENT_ID_RE
from ng_otel.contract.header import OMITTED_VALUE, check_header_value, decode_json, encode_header_json
from ng_otel.otel.names import CONTEXT_HEADER

NOT_EXPORTED: SpanContext = SpanContext(0, 0, is_remote=False)
"""Recorded here through a tracer that exports nothing (no SDK provider): known, so never
recorded twice, but never claimed as exported in a reply, so a caller exports it itself."""

_CONTEXT_RE = re.compile(r"[0-9a-f]{32}-[0-9a-f]{16}")


# Entries the garbage collector does not track (``PlainSpanContext``): a full index would
# otherwise hold 20,000 objects (a SpanContext and its TraceFlags per event) for every full
# collection to walk. A context with a trace state, and the sentinels (compared by identity),
# are kept as they are.
_Entry = PlainSpanContext | SpanContext


def index_entry(context: SpanContext) -> _Entry:
    """How the index holds ``context``."""
    return plain_span_context(context) or context


class LinkIndex:
    """A thread-safe LRU map event id -> span context, at most ``capacity`` entries."""

    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ValueError("capacity: must be at least 1")
        self._capacity = capacity
        self._items: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._items

    def get(self, event_id: str) -> SpanContext | None:
        self._lock.acquire()  # acquire/release, not `with`: half its cost, and this runs per event
        try:
            entry = self._items.get(event_id)
            if entry is None:
                return None
            self._items.move_to_end(event_id)
        finally:
            self._lock.release()
        return entry if isinstance(entry, SpanContext) else span_context_of(entry)

    def add(self, event_id: str, context: SpanContext, entry: _Entry | None = None) -> bool:
        """Remember ``event_id``; False when it was known already (nothing changes then).
        ``entry``: ``index_entry(context)``, when the caller has it (for a span's every event)."""
        if entry is None:
            entry = index_entry(context)
        self._lock.acquire()
        try:
            if event_id in self._items:
                self._items.move_to_end(event_id)
                return False
            self._items[event_id] = entry
            if len(self._items) > self._capacity:
                self._items.popitem(last=False)
            return True
        finally:
            self._lock.release()

    def set(self, event_id: str, context: SpanContext) -> None:
        entry = index_entry(context)
        with self._lock:
            self._items[event_id] = entry
            self._items.move_to_end(event_id)
            if len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def contexts_for(self, event_ids: Iterable[str]) -> dict[str, SpanContext]:
        """Where each of ``event_ids`` was exported, for those this process knows were. The
        events of one span share one context object."""
        contexts: dict[str, SpanContext] = {}
        shared: dict[PlainSpanContext, SpanContext] = {}
        for event_id, entry in self._exported(event_ids):
            if isinstance(entry, SpanContext):
                contexts[event_id] = entry
                continue
            context = shared.get(entry)
            if context is None:
                context = shared[entry] = span_context_of(entry)
            contexts[event_id] = context
        return contexts

    def recorded_at(self, event_ids: Iterable[str]) -> dict[str, str]:
        """``contexts_for`` in the form a reply header and a saved row carry it: event id ->
        ``<32 hex trace id>-<16 hex span id>``, each span formatted once."""
        where: dict[str, str] = {}
        formatted: dict[PlainSpanContext, str] = {}
        for event_id, entry in self._exported(event_ids):
            if isinstance(entry, SpanContext):
                where[event_id] = format_span_context(entry)
                continue
            text = formatted.get(entry)
            if text is None:
                text = formatted[entry] = f"{entry[0]:032x}-{entry[1]:016x}"  # _where's, inline: once per span
            where[event_id] = text
        return where

    def _exported(self, event_ids: Iterable[str]) -> list[tuple[str, _Entry]]:
        """(event id, entry) for each of ``event_ids`` known as exported (not ``NOT_EXPORTED``)."""
        items = self._items
        exported = []
        self._lock.acquire()
        try:
            for event_id in event_ids:
                entry = items.get(event_id)
                if entry is not None and entry is not NOT_EXPORTED:
                    exported.append((event_id, entry))
        finally:
            self._lock.release()
        return exported


def format_span_context(context: SpanContext) -> str:
    return _where(context.trace_id, context.span_id)


def _where(trace_id: int, span_id: int) -> str:
    """Where an event was recorded, as the context header and a saved row write it."""
    return f"{trace_id:032x}-{span_id:016x}"


def encode_context_header(contexts: Mapping[str, SpanContext]) -> str:
    """The ``X-NG-Failure-Context`` value; ``{"omitted":true}`` when it exceeds 4096 bytes,
    which tells the caller the events were exported but their spans are not known."""
    return encode_recorded_at({event_id: format_span_context(context) for event_id, context in contexts.items()})


def encode_recorded_at(where: dict[str, str]) -> str:
    """``encode_context_header`` of what ``LinkIndex.recorded_at`` returns."""
    value = encode_header_json(where)
    return value if value is not None else OMITTED_VALUE


def decode_context_header(value: str | bytes) -> dict[str, SpanContext] | None:
    """Event id -> remote span context, or ``None`` for ``{"omitted":true}``. Raises
    ``ValueError`` naming what is wrong."""
    return decode_context_map(decode_json(check_header_value(value, CONTEXT_HEADER), CONTEXT_HEADER))


def decode_context_map(data: object) -> dict[str, SpanContext] | None:
    """The decoded JSON of a context header (or a saved row's contexts)."""
    if not isinstance(data, dict):
        raise ValueError(f"{CONTEXT_HEADER}: value must be a JSON object")
    if data == {"omitted": True}:
        return None
    contexts = {}
    for event_id, raw in data.items():
        if not EVENT_ID_RE.fullmatch(event_id):
            raise ValueError(f"{CONTEXT_HEADER}: malformed event id")
        if not isinstance(raw, str) or not _CONTEXT_RE.fullmatch(raw):
            raise ValueError(f"{CONTEXT_HEADER}: {event_id}: expected <32 hex trace id>-<16 hex span id>")
        trace_id, span_id = int(raw[:32], 16), int(raw[33:], 16)
        if not trace_id or not span_id:
            if trace_id or span_id:
                raise ValueError(f"{CONTEXT_HEADER}: {event_id}: trace and span ids are both zero or neither")
            contexts[event_id] = INVALID_SPAN_CONTEXT  # exported by the callee, on a span it cannot name
            continue
        contexts[event_id] = span_context_of((trace_id, span_id, TraceFlags.SAMPLED, True))  # checked above
    return contexts
