"""The reply-header encoding shared by every ng_otel header (Gym Main's failure-report header).

aiohttp rejects a reply header line over 8190 bytes, so a value is compact ASCII JSON of at
most ``MAX_HEADER_BYTES``; callers decide what to send instead of a value that does not fit.
"""

from __future__ import annotations

import json
from typing import Any, Final

import orjson

REPORT_HEADER: Final = "X-NG-Failure-Report"
MAX_HEADER_BYTES: Final = 4096
OMITTED_VALUE: Final = '{"omitted":true}'

_escaping_encode = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), check_circular=False).encode


def encode_ascii_json(value: Any) -> str:
    """Compact JSON in which every character is a visible ASCII character or a space: what
    an HTTP header value may hold (no control character, no DEL, nothing above 0x7e)."""
    # orjson is an order of magnitude faster on a failing request's hot path; it writes UTF-8
    # and leaves DEL raw, so such text takes the escaping encoder instead.
    try:
        encoded = orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: a type or an integer orjson does not take
        return _escaping_encode(value)
    if encoded.isascii() and b"\x7f" not in encoded:
        return encoded.decode("ascii")
    return _escaping_encode(value)


def encode_header_json(value: Any) -> str | None:
    """``encode_ascii_json(value)``, or ``None`` when it exceeds ``MAX_HEADER_BYTES``."""
    text = encode_ascii_json(value)
    return text if len(text) <= MAX_HEADER_BYTES else None


def decode_json(data: str | bytes, what: str) -> Any:
    """JSON that came from outside: ``ValueError`` naming ``what`` for anything that is not
    JSON, nesting past orjson's depth bound (1024) included, which the standard library
    would meet with a ``RecursionError`` instead."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise ValueError(f"{what}: not JSON ({str(error).split(':', 1)[0]})") from None


def check_header_value(value: object, header: str) -> str:
    """Reject what no conforming sender produces before any parsing work is done."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(f"{header}: value is not ASCII") from None
    if not isinstance(value, str):
        raise ValueError(f"{header}: value must be a string")
    if len(value) > MAX_HEADER_BYTES:
        raise ValueError(f"{header}: value is {len(value)} bytes, over the {MAX_HEADER_BYTES}-byte bound")
    if not value.isascii():
        raise ValueError(f"{header}: value is not ASCII")
    return value
