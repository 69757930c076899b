"""Domain rules the adapters apply alike, registered by the package that owns them.

An adapter knows frameworks, not Gym: what an exception that escapes a handler means, and at
which boundary this process sees failures, are rules ``ng_otel.gym`` registers here (as
contrib instrumentations take ``server_request_hook``). With nothing registered, an adapter
records only Gym failures (``NgFailureEvent`` in the explicit chain) and reports the boundary
``harness`` for its client side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ng_otel.contract.report import FailureReport

EscapeHook = Callable[[BaseException], "FailureReport | None"]
"""The report for an exception that escapes a handler with no Gym failure in its chain
(``None``: not a failure this process reports)."""
TransportKind = Callable[[BaseException], "str | None"]
"""The kind of a failed attempt that got no reply, when the caller resends such requests
(``None``: not one this process reports)."""

DEFAULT_CLIENT_BOUNDARY = "harness"


@dataclass
class _Rules:
    escape: EscapeHook | None = None
    transport_kind: TransportKind | None = None
    client_boundary: str = DEFAULT_CLIENT_BOUNDARY


rules = _Rules()


def set_escape_hook(hook: EscapeHook | None) -> None:
    """Use ``hook`` for every exception that escapes a handler (``None``: none)."""
    rules.escape = hook


def set_client_boundary(boundary: str) -> None:
    """The boundary a failed outbound request of this process is seen at."""
    rules.client_boundary = boundary


def set_transport_kind(rule: TransportKind | None) -> None:
    """Report each failed attempt that ``rule`` names a kind for (``None``: none)."""
    rules.transport_kind = rule


def reset() -> None:
    """Forget every registered rule (tests)."""
    rules.escape = None
    rules.transport_kind = None
    rules.client_boundary = DEFAULT_CLIENT_BOUNDARY
