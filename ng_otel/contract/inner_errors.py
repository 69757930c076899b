"""A NeMo Gym 0.7.0 failed reply's body read as the chain of servers it names.

Gym's catch-all (``SimpleServer.setup_exception_middleware`` in ``nemo_gym/server_utils.py``)
answers a server whose call to another server failed with a JSON 500 whose content is::

    f"Hit an exception in {type(self).__name__}___{self.config.name} calling an inner server: {e.response_content}"

``response_content`` is the callee's body as ``bytes``, so each hop holds the Python ``repr``
of the next hop's JSON body, down to the provider's own error at the core. Rollout collection
saves the outermost body, cut to 2,000 characters (``_truncated_body``), as a row's
``_ng_failure_response_body``. ``parse_inner_error`` reads it back, outermost server first,
without ``eval``: every level is decoded by hand in one linear pass, the input and the depth
are bounded, and whatever does not read as a hop is kept as text. It never raises.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from ng_otel.contract import kinds as k
from ng_otel.contract.events import MAX_REASON_CHARS, bound_text

MAX_BODY_CHARS: Final = 64 * 1024
"""Longest body read; past it the text is cut. Gym keeps 2,000 characters, so a real row is
never cut here, and the bound keeps a hostile row's cost at a few milliseconds."""
MAX_HOPS: Final = 16
"""Most servers read out of one body; a deeper body keeps its remaining levels as text. Each
level at least doubles the escapes of the level inside it, so 2,000 characters hold ~5."""
MAX_NAME_CHARS: Final = 128
"""Longest class or server name a hop may have: anything longer is not one of Gym's."""
MAX_JSON_CORE_CHARS: Final = MAX_BODY_CHARS
"""Longest core decoded as JSON to find its message (bounded by the body anyway)."""

GYM_ERROR_STATUS: Final = 500
"""What Gym's catch-all answers for every exception it catches: the status of each server a
"Hit an exception ..." body names."""

HOP_PREFIX: Final = "Hit an exception in "
HOP_SEPARATOR: Final = "___"  # get_session_middleware_key: f"{class}___{config name}"
HOP_INFIX: Final = " calling an inner server: "
_HOP_HEADER_MAX: Final = len(HOP_PREFIX) + 2 * MAX_NAME_CHARS + len(HOP_SEPARATOR) + len(HOP_INFIX)

# Gym config names are YAML keys; its own are [a-z0-9_]. Anything outside this is not a hop.
_SERVER_NAME_RE: Final = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_NAME_CHARS}}}")
# One character class, no repetition: a linear scan for what ends a run of plain text.
_JSON_SPECIAL_RE: Final = re.compile(r'["\\]')
_BYTES_SPECIAL_RE: Final = {"'": re.compile(r"['\\]"), '"': re.compile(r'["\\]')}

# How Gym names its server classes, by the base each derives from (0.7.0's stock servers:
# ``SimpleAgent``, ``SimpleModelServer``, ``VLLMModel``, ``SimpleQAServer``...). Resources
# servers are too often named ``...Server`` to tell from the class: only ``...ResourcesServer``
# is read as one; a bare ``...Server`` stays unknown unless the caller names its boundary.
CLASS_SUFFIX_BOUNDARIES: Final[tuple[tuple[str, str], ...]] = (
    ("EnvironmentServer", "environment"),
    ("ResourcesServer", "resources_server"),
    ("ModelServer", "model"),
    ("Model", "model"),
    ("Agent", "agent"),
)

# The failure of a server whose handler ran and broke, by the server's boundary: what the live
# path records (ng_otel/gym/failures.py) and what each server a row's body names is read as
# (its callee answered 500, which names no kind of its own).
RUN_ERROR_KINDS: Final[Mapping[str, str]] = {
    "model": k.PROVIDER_UNAVAILABLE,  # the model server got no completion from its backend
    "agent": k.AGENT_RUN_ERROR,
    "resources_server": k.VERIFIER_ERROR,
    "environment": k.ENVIRONMENT_SERVER_FAILED,
    "harness": k.AGENT_RUN_ERROR,
    "collection": k.AGENT_RUN_ERROR,
}
SERVER_BOUNDARIES: Final = frozenset({"model", "agent", "resources_server", "environment"})  # what a hop may be

NO_INNER_REASON: Final = "the innermost server's reply held no text"

# Row keys this module reads beside rows.py's (Gym 0.7.0's global_config.py names them).
ROW_FAILURE_RESPONSE_BODY: Final = "_ng_failure_response_body"  # the failed reply's body, as collection kept it
ROW_AGENT_REF: Final = "agent_ref"
ROW_ENVIRONMENT_SERVER: Final = "_ng_environment_server"


@dataclass(frozen=True, slots=True)
class InnerHop:
    """One server a body names: ``SimpleAgent___simpleqa_simple_agent`` is class
    ``SimpleAgent``, server ``simpleqa_simple_agent``, boundary ``agent``."""

    class_name: str
    server: str
    boundary: str | None  # None: a class whose kind Gym's naming does not tell


@dataclass(frozen=True, slots=True)
class InnerErrorChain:
    """What a failed reply's body says: the servers it names, outermost first, and the
    innermost reply's own words."""

    hops: tuple[InnerHop, ...]
    reason: str | None  # the provider's message when its JSON has one, else its text; bounded
    cut: bool  # the body ended early (Gym's 2,000 characters, MAX_BODY_CHARS) or went past MAX_HOPS


EMPTY_CHAIN: Final = InnerErrorChain((), None, False)


def class_boundary(class_name: str) -> str | None:
    """The boundary of a Gym server class by its name, or ``None`` when the name does not say."""
    for suffix, boundary in CLASS_SUFFIX_BOUNDARIES:
        if class_name.endswith(suffix):
            return boundary
    return None


def parse_inner_error(body: object, *, server_boundaries: Mapping[str, str] | None = None) -> InnerErrorChain:
    """The chain a Gym failed reply's body holds. ``body`` is the body as text (a row's
    ``_ng_failure_response_body``), or anything else, which holds nothing.
    ``server_boundaries`` names the boundary of servers known by name (the row's agent), which
    wins over the class name. Never raises; linear in ``min(len(body), MAX_BODY_CHARS)``
    per level, at most ``MAX_HOPS + 1`` levels, each shorter than the one around it."""
    if isinstance(body, (bytes, bytearray)):
        body = bytes(body[: MAX_BODY_CHARS * 4]).decode("utf-8", "replace")
    if not isinstance(body, str) or not body:
        return EMPTY_CHAIN
    try:
        return _parse(body, server_boundaries or {})
    except Exception:  # a defect here must not cost the row: the body stays text
        return InnerErrorChain((), _reason_text(body[:MAX_REASON_CHARS]), len(body) > MAX_REASON_CHARS)


def _parse(body: str, server_boundaries: Mapping[str, str]) -> InnerErrorChain:
    cut = len(body) > MAX_BODY_CHARS
    text = body[:MAX_BODY_CHARS]
    hops: list[InnerHop] = []
    while True:
        text = text.strip()
        if text.startswith('"'):  # the level's JSON body: FastAPI's JSONResponse of a string
            text, complete = _json_string(text)
            cut = cut or not complete
        header = _hop_header(text)
        if header is None:
            break  # the core: the innermost reply's own body
        if len(hops) == MAX_HOPS:
            cut = True
            break
        class_name, server, rest_at = header
        boundary = server_boundaries.get(server) or class_boundary(class_name)
        hops.append(InnerHop(class_name, server, boundary))
        rest = text[rest_at:]
        if rest[:2] in ("b'", 'b"'):
            content, complete = _bytes_literal(rest)
            cut = cut or not complete
            text = content.decode("utf-8", "replace")
        else:
            text = rest  # content that was text rather than bytes: the next level as it is
    return InnerErrorChain(tuple(hops), _core_reason(text), cut)


def _hop_header(text: str) -> tuple[str, str, int] | None:
    """(class name, server name, where the callee's body starts) of a level that is a hop."""
    if not text.startswith(HOP_PREFIX):
        return None
    infix_at = text.find(HOP_INFIX, len(HOP_PREFIX), _HOP_HEADER_MAX)
    if infix_at < 0:
        return None
    class_name, separator, server = text[len(HOP_PREFIX) : infix_at].partition(HOP_SEPARATOR)
    if (
        not separator
        or len(class_name) > MAX_NAME_CHARS
        or not class_name.isidentifier()
        or _SERVER_NAME_RE.fullmatch(server) is None
    ):
        return None
    return class_name, server, infix_at + len(HOP_INFIX)


_JSON_ESCAPES: Final = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")
_UNICODE_ESCAPE_DIGITS: Final = 4
_BYTE_ESCAPE_DIGITS: Final = 2


def _json_string(text: str) -> tuple[str, bool]:
    """A JSON string literal at the start of ``text`` decoded, and whether it was closed.
    Tolerant: an escape JSON does not know is kept as written, a cut one kept as far as it
    goes, text after the closing quote dropped. Chunks between escapes are copied whole."""
    parts: list[str] = []
    at = 1  # past the opening quote
    for special in _JSON_SPECIAL_RE.finditer(text, 1):
        start = special.start()
        if start < at:
            continue  # the character an escape consumed
        parts.append(text[at:start])
        if special.group() == '"':
            return "".join(parts), True
        code = text[start + 1 : start + 2]
        if code in _JSON_ESCAPES:
            parts.append(_JSON_ESCAPES[code])
            at = start + 2
        elif code == "u" and _is_hex(text, start + 2, _UNICODE_ESCAPE_DIGITS):
            character, at = _unicode_escape(text, start)
            parts.append(character)
        else:
            parts.append("\\" + code)  # not JSON's: kept as written
            at = start + 1 + len(code)
    parts.append(text[at:])
    return "".join(parts), False


_BYTES_ESCAPES: Final = {
    "\\": b"\\",
    "'": b"'",
    '"': b'"',
    "n": b"\n",
    "r": b"\r",
    "t": b"\t",
    "a": b"\a",
    "b": b"\b",
    "f": b"\f",
    "v": b"\v",
    "0": b"\0",
}


def _bytes_literal(text: str) -> tuple[bytes, bool]:
    """A Python ``bytes`` literal's ``repr`` at the start of ``text`` (``b'...'`` or
    ``b"..."``) decoded, and whether it was closed. ``repr`` writes printable ASCII as is and
    escapes the rest; a character outside ASCII (the body was not a repr) is kept as UTF-8,
    an unknown or cut escape as written. One buffer: no object per escape."""
    quote = text[1]
    content = bytearray()
    at = 2
    for special in _BYTES_SPECIAL_RE[quote].finditer(text, 2):
        start = special.start()
        if start < at:
            continue
        content += text[at:start].encode("utf-8", "surrogatepass")
        if special.group() == quote:
            return bytes(content), True
        code = text[start + 1 : start + 2]
        if code in _BYTES_ESCAPES:
            content += _BYTES_ESCAPES[code]
            at = start + 2
        elif code == "x" and _is_hex(text, start + 2, _BYTE_ESCAPE_DIGITS):
            content.append(int(text[start + 2 : start + 4], 16))
            at = start + 4
        else:
            content += ("\\" + code).encode("utf-8", "surrogatepass")
            at = start + 1 + len(code)
    content += text[at:].encode("utf-8", "surrogatepass")
    return bytes(content), False


def _is_hex(text: str, start: int, digits: int) -> bool:
    chunk = text[start : start + digits]
    return len(chunk) == digits and all(c in _HEX_DIGITS for c in chunk)


_HIGH_SURROGATES: Final = range(0xD800, 0xDC00)
_LOW_SURROGATES: Final = range(0xDC00, 0xE000)
_SURROGATE_BASE: Final = 0x10000
_SURROGATE_BITS: Final = 10
_UNICODE_ESCAPE_CHARS: Final = 2 + _UNICODE_ESCAPE_DIGITS  # a backslash, "u", four hex digits


def _unicode_escape(text: str, start: int) -> tuple[str, int]:
    """The character of the ``\\u`` escape (four hex digits) at ``start`` (a surrogate pair joined, a
    lone surrogate replaced: no reason may hold one, which UTF-8 cannot write) and where the
    text goes on."""
    end = start + _UNICODE_ESCAPE_CHARS
    code = int(text[start + 2 : end], 16)
    if code in _HIGH_SURROGATES and text[end : end + 2] == "\\u" and _is_hex(text, end + 2, _UNICODE_ESCAPE_DIGITS):
        low = int(text[end + 2 : end + _UNICODE_ESCAPE_CHARS], 16)
        if low in _LOW_SURROGATES:
            high_bits = (code - _HIGH_SURROGATES.start) << _SURROGATE_BITS
            return chr(_SURROGATE_BASE + high_bits + low - _LOW_SURROGATES.start), end + _UNICODE_ESCAPE_CHARS
    if code in _HIGH_SURROGATES or code in _LOW_SURROGATES:
        return "\ufffd", end
    return chr(code), end


def _core_reason(core: str) -> str | None:
    """The innermost reply's own words: its JSON's ``error.message``, ``message`` or
    ``detail`` when it has one (an OpenAI-compatible error, FastAPI's ``HTTPException``),
    else its text; ``None`` when it is empty."""
    text = core.strip()
    if not text:
        return None
    if text[0] == "{" and len(text) <= MAX_JSON_CORE_CHARS:
        try:
            message = _message_of(json.loads(text))
        except (ValueError, RecursionError):
            message = None  # not JSON (cut by Gym's bound, say): the text is the reason
        if message:
            return _reason_text(message)
    return _reason_text(text)


def _message_of(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    error = value.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"].strip():
        return str(error["message"])
    for key in ("message", "detail"):
        if isinstance(value.get(key), str) and value[key].strip():
            return str(value[key])
    if isinstance(error, str) and error.strip():
        return error
    return None


def _reason_text(text: str) -> str:
    # Lone surrogates (from a row's own escapes) become "?": a reason is written as UTF-8.
    return bound_text(text.strip()[: MAX_REASON_CHARS * 2].encode("utf-8", "replace").decode("utf-8"))


# -- the chain as failure records --------------------------------------------------------------


class ChainRecords(NamedTuple):
    """A row's failure as records, effect first: the outer record, then one per server the
    body names whose boundary is known, each the cause of the one above. ``servers`` runs
    beside ``records``: the server that recorded each (``None`` for the outer one, whose
    process the row does not name), as the live path's ``service.name`` resource attribute."""

    records: tuple[dict[str, Any], ...]
    servers: tuple[str | None, ...]

    def server_by_event(self) -> dict[str, str]:
        """Event id -> server name, for the records whose server is named."""
        return {
            record["event_id"]: server
            for record, server in zip(self.records, self.servers, strict=True)
            if server is not None
        }


def chain_records(outer: Mapping[str, Any], chain: InnerErrorChain) -> ChainRecords:
    """``outer`` (the record of the failure the row's saver saw, with its ``event_id``) caused
    by one event per server of ``chain`` whose boundary is known, at that boundary, of the
    kind the live path gives a server whose inner call failed, answering Gym's 500; the
    innermost one's reason is the core's. A hop of unknown boundary makes no event (no
    boundary would be true of it); the chain goes on past it. Each id is derived from the
    outer one and the hop's place, so the same row names the same failures every time.
    ``outer`` is returned alone (copied) when it already has a cause or ``chain`` no hop."""
    top = dict(outer)
    known = [(index, hop) for index, hop in enumerate(chain.hops) if hop.boundary in SERVER_BOUNDARIES]
    if not known or "cause_id" in top or not isinstance(top.get("event_id"), str):
        return ChainRecords((top,), (None,))
    records = [top]
    servers: list[str | None] = [None]
    for place, (index, hop) in enumerate(known):
        boundary = hop.boundary
        assert boundary is not None  # known: a server's boundary
        innermost = place == len(known) - 1
        if innermost:
            reason = chain.reason or NO_INNER_REASON
        else:
            reason = f"{hop.server} got a failed reply {GYM_ERROR_STATUS} from {chain.hops[index + 1].server}"
        record = {
            "event_id": inner_event_id(top["event_id"], index),
            "boundary": boundary,
            "failure_kind": RUN_ERROR_KINDS[boundary],
            "failure_reason": bound_text(reason),
            "http_status": GYM_ERROR_STATUS,
        }
        records[-1]["cause_id"] = record["event_id"]
        records.append(record)
        servers.append(hop.server)
    return ChainRecords(tuple(records), tuple(servers))


def inner_event_id(outer_event_id: str, hop_index: int) -> str:
    """The event id of the ``hop_index``-th server (0: outermost) named under ``outer_event_id``."""
    return hashlib.sha256(f"{outer_event_id}/inner/{hop_index}".encode()).hexdigest()[:32]


def row_server_boundaries(row: Mapping[str, Any]) -> dict[str, str]:
    """The servers a row names itself: its agent (``agent_ref.name``) and environment server
    (``_ng_environment_server``), at their boundaries."""
    named: dict[str, str] = {}
    environment = row.get(ROW_ENVIRONMENT_SERVER)
    if isinstance(environment, str):
        named[environment] = "environment"
    agent_ref = row.get(ROW_AGENT_REF)
    agent = agent_ref.get("name") if isinstance(agent_ref, Mapping) else None
    if isinstance(agent, str):
        named[agent] = "agent"
    return named


_LOOKAHEAD_CHARS: Final = 64  # where a body that names a server starts saying so


def row_chain_records(row: Mapping[str, Any], outer: Mapping[str, Any]) -> ChainRecords:
    """A 0.7.0 failure row's chain: ``outer`` (the record ``rows`` builds for the row, seen by
    collection) caused by each server its ``_ng_failure_response_body`` names. A row whose
    body names none (most: a judge row, a refused connection) is ``outer`` alone, read
    without parsing."""
    if not body_names_servers(row):
        return ChainRecords((dict(outer),), (None,))
    body = row[ROW_FAILURE_RESPONSE_BODY]
    return chain_records(outer, parse_inner_error(body, server_boundaries=row_server_boundaries(row)))


def body_names_servers(row: Mapping[str, Any]) -> bool:
    """Whether a 0.7.0 row's ``_ng_failure_response_body`` starts the way Gym's nested bodies
    do (a look at its first characters: what lets a reader skip the rest cheaply)."""
    body = row.get(ROW_FAILURE_RESPONSE_BODY)
    return isinstance(body, str) and body[:_LOOKAHEAD_CHARS].lstrip().lstrip('"').startswith(HOP_PREFIX)
