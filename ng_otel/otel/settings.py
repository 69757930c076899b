"""Configuration, read once: explicit arguments, then the environment, then defaults.

| variable | default | meaning |
|---|---|---|
| ``NG_OTEL_ENABLED`` | ``1`` | ``0``/``false`` turns every entry point into a flag check |
| ``NG_OTEL_SIGNALS`` | ``spans`` | ``spans``, ``logs`` or ``spans,logs``: logs mode emits log records |
| ``NG_OTEL_MAX_KINDS`` | ``200`` | distinct unregistered kinds labelled per process before ``_other`` |
| ``NG_OTEL_LINK_INDEX_SIZE`` | ``10000`` | event ids whose span context a process remembers for links |

Every standard ``OTEL_*`` variable is read by the OpenTelemetry SDK and exporters themselves.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
SIGNALS = frozenset({"spans", "logs"})


@dataclass(frozen=True)
class Settings:
    enabled: bool = True
    signals: frozenset[str] = frozenset({"spans"})
    max_kinds: int = 200
    link_index_size: int = 10_000

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Arguments win over ``NG_OTEL_*`` variables, which win over defaults. A malformed
        variable raises ``ValueError`` naming it: a typo in deployment config should be loud."""
        env = os.environ if environ is None else environ
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        if "NG_OTEL_ENABLED" in env:
            values["enabled"] = _parse_bool("NG_OTEL_ENABLED", env["NG_OTEL_ENABLED"])
        if "NG_OTEL_SIGNALS" in env:
            values["signals"] = env["NG_OTEL_SIGNALS"]
        if "NG_OTEL_MAX_KINDS" in env:
            values["max_kinds"] = _parse_int("NG_OTEL_MAX_KINDS", env["NG_OTEL_MAX_KINDS"])
        if "NG_OTEL_LINK_INDEX_SIZE" in env:
            values["link_index_size"] = _parse_int("NG_OTEL_LINK_INDEX_SIZE", env["NG_OTEL_LINK_INDEX_SIZE"])
        values.update(overrides)
        values["signals"] = _parse_signals(values.get("signals", cls.signals))
        for name in ("max_kinds", "link_index_size"):
            if name in values and (type(values[name]) is not int or values[name] < 1):
                raise ValueError(f"{name}: must be a positive integer")
        return cls(**values)


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}: expected one of 1/0/true/false, got {raw[:20]!r}")


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {raw[:20]!r}") from None


def _parse_signals(raw: object) -> frozenset[str]:
    if isinstance(raw, str):
        items = {part.strip() for part in raw.split(",") if part.strip()}
    elif isinstance(raw, (set, frozenset, list, tuple)):
        items = {str(part) for part in raw}
    else:
        raise ValueError("NG_OTEL_SIGNALS: expected a comma-separated string")
    if not items or not items <= SIGNALS:
        raise ValueError(f"NG_OTEL_SIGNALS: expected spans, logs or spans,logs, got {sorted(items)!r}"[:120])
    return frozenset(items)
