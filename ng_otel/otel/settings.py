"""ng_otel's own settings: explicit arguments, then ``NG_OTEL_*`` variables, then defaults.

Each variable is declared once, in ``PARAMS``; ``Settings`` and the table in
``docs/configuration.md`` both come from it (a test keeps the two equal). Every standard
``OTEL_*`` variable is read by the OpenTelemetry SDK and exporters themselves.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ng_otel.otel import names

SIGNALS: Final = frozenset({"spans", "logs"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_SHOWN_CHARS = 40  # how much of a bad value an error message quotes

Source = Literal["argument", "environment", "default"]


class SettingsError(ValueError):
    """A setting's value is not one ng_otel can use; the message names it and the value."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_not_enabled(reason: str) -> None:
    """The one WARNING line that says why ng_otel stays off (once per reason per process:
    start-up and each ``enable()`` call reach the same verdict)."""
    with _warned_lock:
        if reason in _warned:
            return
        _warned.add(reason)
    logging.getLogger("ng_otel").warning("ng_otel: not enabled: %s", reason)


_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s]*@)?(?P<rest>[^\s'\"<>]*)")
_QUERY_VALUE = re.compile(r"(?P<key>[?&;][^=&;#\s]+=)[^&;#\s]*")
REDACTED: Final = "***"


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``: the userinfo
    (``user:secret@``) and every query value (``?token=...``), which endpoints may carry.
    Whatever ng_otel prints of an endpoint or a variable goes through this."""

    def one(url: re.Match[str]) -> str:
        userinfo = f"{REDACTED}@" if url["userinfo"] else ""
        return url["scheme"] + userinfo + _QUERY_VALUE.sub(lambda q: q["key"] + REDACTED, url["rest"])

    return _URL.sub(one, text)


def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


def parse_signals(raw: str) -> frozenset[str]:
    items = frozenset(part.strip().lower() for part in raw.split(",") if part.strip())
    if not items or not items <= SIGNALS:
        raise ValueError("expected spans, logs or spans,logs")
    return items


EXPORTS: Final = ("auto", "jsonl", "otel")


def parse_export(raw: str) -> str:
    value = raw.strip().lower()
    if value not in EXPORTS:
        raise ValueError("expected auto, jsonl or otel")
    return value


def parse_positive_seconds(raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError("expected a positive number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("expected a positive number of seconds")
    return value


def parse_path(raw: str) -> str:
    return raw.strip()


def parse_positive_int(raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError("expected a positive integer") from None
    if value < 1:
        raise ValueError("expected a positive integer")
    return value


@dataclass(frozen=True)
class Param:
    """One setting: its attribute on ``Settings``, its variable, how a value is read, its
    default, and what it means (the documentation's words)."""

    attribute: str
    variable: str
    parse: Callable[[str], Any]
    default: Any
    default_text: str
    meaning: str


PARAMS: Final = (
    Param(
        "enabled",
        "NG_OTEL_ENABLED",
        parse_bool,
        True,
        "1",
        "`0`/`false`: every entry point is a flag check, nothing is recorded or sent",
    ),
    Param(
        "signals",
        "NG_OTEL_SIGNALS",
        parse_signals,
        frozenset({"spans"}),
        "spans",
        f"where each failure goes: `spans` (an `{names.EVENT}` span event), `logs` (an OTel log record with "
        f'`event_name="{names.EVENT}"` in the span\'s context, instead of the span event) or `spans,logs` (both); '
        "links and counts are the same in every mode",
    ),
    Param(
        "max_kinds",
        "NG_OTEL_MAX_KINDS",
        parse_positive_int,
        200,
        "200",
        "distinct unregistered kinds labelled per process before further new ones count as `_other`",
    ),
    Param(
        "link_index_size",
        "NG_OTEL_LINK_INDEX_SIZE",
        parse_positive_int,
        10_000,
        "10000",
        "event ids whose span context a process remembers for links and exactly-once (LRU)",
    ),
    Param(
        "sigterm_flush",
        "NG_OTEL_SIGTERM_FLUSH",
        parse_bool,
        True,
        "1",
        "where nothing else handles SIGTERM and `enable()` installed the providers, a SIGTERM handler flushes "
        "them (bounded by the exporters' timeouts) and then ends the process as SIGTERM would; `0`: no handler",
    ),
    Param(
        "ray_processes",
        "NG_OTEL_RAY_PROCESSES",
        parse_bool,
        False,
        "0",
        "`1`: `opentelemetry-instrument` enables ng_otel in Ray's own processes too (workers, dashboard), "
        "which inherit a Gym deployment's environment; off, they export nothing of ng_otel's (and `_NG_OTEL_IN_RAY=1` "
        "marks them, so the processes they start are left out too)",
    ),
    Param(
        "send_receive_spans",
        "NG_OTEL_SEND_RECEIVE_SPANS",
        parse_bool,
        False,
        "0",
        "`1`: under `opentelemetry-instrument`, OpenTelemetry's ASGI middleware (FastAPI's, Starlette's) also "
        "records its internal `http send` and `http receive` spans; off, as Logfire does, an app that does not "
        "pass `exclude_spans` itself gets none (they were 4 of every 5 spans a Gym rollout exported, and most of "
        "what tracing cost it: docs/performance.md)",
    ),
    Param(
        "stall_seconds",
        "NG_OTEL_STALL_SECONDS",
        parse_positive_seconds,
        600.0,
        "600",
        "a rollout whose `/run` has not answered after this many seconds is stalled: counted in "
        f"`{names.STALLED_METRIC}` and recorded once as an `{names.EVENT}` event with `{names.ROLLOUT_STALLED}=true`",
    ),
    Param(
        "max_agents",
        "NG_OTEL_MAX_AGENTS",
        parse_positive_int,
        64,
        "64",
        f"distinct agent names labelled per process (`{names.ROLLOUT_AGENT}`) before further new ones count as "
        f"`{names.OTHER_AGENT}`",
    ),
    Param(
        "export",
        "NG_OTEL_EXPORT",
        parse_export,
        "auto",
        "auto",
        "`auto`: every failure event, retry outcome and rollout outcome is also one JSON line (docs/conventions.md, "
        '"JSON lines") whenever no OpenTelemetry SDK records (no SDK tracer provider installed, '
        "`OTEL_SDK_DISABLED=true`); `jsonl`: always; `otel`: never",
    ),
    Param(
        "jsonl_file",
        "NG_OTEL_JSONL_FILE",
        parse_path,
        "-",
        "-",
        "where the JSON lines go: `-` (or empty) for stderr, else a file appended to (opened once, each line written "
        "whole)",
    ),
)


@dataclass(frozen=True)
class Settings:
    enabled: bool = True
    signals: frozenset[str] = frozenset({"spans"})
    max_kinds: int = 200
    link_index_size: int = 10_000
    sigterm_flush: bool = True
    ray_processes: bool = False
    send_receive_spans: bool = False
    stall_seconds: float = 600.0
    max_agents: int = 64
    export: str = "auto"
    jsonl_file: str = "-"
    sources: Mapping[str, Source] = field(default_factory=dict, compare=False, repr=False)
    """Where each value came from: ``argument``, ``environment`` or ``default``."""

    @classmethod
    def resolve(
        cls,
        *,
        enabled: bool | None = None,
        signals: str | frozenset[str] | set[str] | None = None,
        max_kinds: int | None = None,
        link_index_size: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Settings:
        """Arguments win over ``NG_OTEL_*`` variables, which win over defaults. A bad value
        raises ``SettingsError`` naming the argument or variable and the value."""
        arguments = {"enabled": enabled, "signals": signals, "max_kinds": max_kinds, "link_index_size": link_index_size}
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        sources: dict[str, Source] = {}
        for param in PARAMS:
            given = arguments.get(param.attribute)
            if given is not None:
                values[param.attribute], sources[param.attribute] = _argument(param, given), "argument"
            elif param.variable in env:
                values[param.attribute], sources[param.attribute] = _variable(param, env[param.variable]), "environment"
            else:
                values[param.attribute], sources[param.attribute] = param.default, "default"
        return cls(**values, sources=sources)


def _variable(param: Param, raw: str) -> Any:
    try:
        return param.parse(raw)
    except ValueError as error:
        raise SettingsError(f"{param.variable}={raw[:_SHOWN_CHARS]!r}: {error}") from None


def _argument(param: Param, value: object) -> Any:
    # Typed arguments, checked like the variables: a bool is not a count, a count is positive.
    try:
        if param.parse is parse_bool:
            if not isinstance(value, bool):
                raise ValueError("expected True or False")
            return value
        if param.attribute == "signals":
            if isinstance(value, str):
                return parse_signals(value)
            if isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(v, str) for v in value):
                return parse_signals(",".join(value))
            raise ValueError("expected spans, logs or spans,logs")
        if type(value) is not int or value < 1:
            raise ValueError("expected a positive integer")
        return value
    except ValueError as error:
        raise SettingsError(f"{param.attribute}={str(value)[:_SHOWN_CHARS]!r}: {error}") from None


def variables_table() -> str:
    """The ``NG_OTEL_*`` table of ``docs/configuration.md``, made from ``PARAMS``."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{p.variable}` | `{p.default_text}` | {p.meaning} |" for p in PARAMS]
    return "\n".join(rows)
