"""Domain rules the adapters apply alike, registered by the package that owns them.

An adapter knows frameworks, not Gym: what an exception that escapes a handler means, and at
which boundary this process sees failures, are rules ``ng_otel.gym`` registers here (as
contrib instrumentations take ``server_request_hook``). With nothing registered, an adapter
records only Gym failures (``NgFailureEvent`` in the explicit chain) and reports the boundary
``harness`` for its client side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final

from ng_otel.contract.report import FailureReport

EscapeHook = Callable[[BaseException], "FailureReport | None"]
"""The report for an exception that escapes a handler with no Gym failure in its chain
(``None``: not a failure this process reports)."""
TransportKind = Callable[[BaseException], "str | None"]
"""The kind of a failed attempt that got no reply, when the caller resends such requests
(``None``: not one this process reports)."""

ReplyReader = Callable[[Any], object]
"""Reads the decoded JSON body of a reply on one of the routes it was registered for (Gym's
``/verify``: a verify outcome); what it returns is ignored."""

DEFAULT_CLIENT_BOUNDARY = "harness"
MAX_READ_REPLY_BYTES: Final = 1 << 20  # a reply to read larger than this is passed on unread


@dataclass
class _Rules:
    escape: EscapeHook | None = None
    transport_kind: TransportKind | None = None
    client_boundary: str = DEFAULT_CLIENT_BOUNDARY
    reply_reader: ReplyReader | None = None
    reply_paths: frozenset[str] = field(default_factory=frozenset)


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


def set_reply_reader(reader: ReplyReader | None, paths: Collection[str] = ()) -> None:
    """Give ``reader`` the JSON replies of the routes ``paths`` (``None``: no reader)."""
    rules.reply_reader = reader
    rules.reply_paths = frozenset(paths) if reader is not None else frozenset()


def saved() -> _Rules:
    """A copy of the rules registered now, for ``restore``."""
    return dataclasses.replace(rules)


def restore(saved_rules: _Rules) -> None:
    """Register again what ``saved`` copied, and nothing else."""
    for rule in dataclasses.fields(_Rules):
        setattr(rules, rule.name, getattr(saved_rules, rule.name))


def reset() -> None:
    """Forget every registered rule (tests)."""
    restore(_Rules())
