"""The shared failure-kind vocabulary, as NeMo Gym's ``nemo_gym/failure_kinds.py`` defines it.

NeMo Gym 0.7.0 registers 22 of these names; ``environment_server_failed`` (0.7.0 rollout
collection's failure class for a failure the environment server reported) and
``protocol_violation`` (what ng_otel records for a peer's invalid report) are registered here
too, so they are labels of their own rather than ``_other``.

A kind says what went wrong and nothing else: retryability, masking and policy belong to
the occurrence, so the registry carries no per-kind metadata. Names are
``<domain>_<condition>``; an environment's own kind is ``<server>:<kind>``. Unknown but
well-formed names warn once and are kept, because rejecting them would trade a visible
wrong label for an invisible lost failure.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from typing import Final

_log = logging.getLogger(__name__)  # under "ng_otel": a command that lists kinds itself quiets it

TRANSPORT_UNREACHABLE: Final = "transport_unreachable"
TRANSPORT_PEER_DROP: Final = "transport_peer_drop"
TRANSPORT_TIMEOUT: Final = "transport_timeout"
TRANSPORT_LOCAL_RESOURCE: Final = "transport_local_resource"
AGENT_RUN_ERROR: Final = "agent_run_error"
AGENT_REQUEST_FAILED: Final = "agent_request_failed"
AGENT_TIMEOUT: Final = "agent_timeout"
AGENT_COMMAND_NOT_ALLOWED: Final = "agent_command_not_allowed"
ENVIRONMENT_SERVER_FAILED: Final = "environment_server_failed"
PROTOCOL_VIOLATION: Final = "protocol_violation"
JUDGE_FAILED: Final = "judge_failed"
JUDGE_UNPARSEABLE: Final = "judge_unparseable"
VERIFIER_ERROR: Final = "verifier_error"
PROVIDER_UNAVAILABLE: Final = "provider_unavailable"
PROVIDER_QUOTA_EXHAUSTED: Final = "provider_quota_exhausted"
PROVIDER_OOM_KILLED: Final = "provider_oom_killed"
SESSION_LOST: Final = "session_lost"
SESSION_EXPIRED: Final = "session_expired"
SESSION_RELEASE_FAILED: Final = "session_release_failed"
CANCELLED: Final = "cancelled"
KILL_SHAPED: Final = "kill_shaped"
SHUTDOWN: Final = "shutdown"
PERSISTENCE_FAILED: Final = "persistence_failed"
COHORT_INCOMPLETE: Final = "cohort_incomplete"

FAILURE_KINDS: Final[frozenset[str]] = frozenset(
    {
        TRANSPORT_UNREACHABLE,
        TRANSPORT_PEER_DROP,
        TRANSPORT_TIMEOUT,
        TRANSPORT_LOCAL_RESOURCE,
        AGENT_RUN_ERROR,
        AGENT_REQUEST_FAILED,
        AGENT_TIMEOUT,
        AGENT_COMMAND_NOT_ALLOWED,
        ENVIRONMENT_SERVER_FAILED,
        PROTOCOL_VIOLATION,
        JUDGE_FAILED,
        JUDGE_UNPARSEABLE,
        VERIFIER_ERROR,
        PROVIDER_UNAVAILABLE,
        PROVIDER_QUOTA_EXHAUSTED,
        PROVIDER_OOM_KILLED,
        SESSION_LOST,
        SESSION_EXPIRED,
        SESSION_RELEASE_FAILED,
        CANCELLED,
        KILL_SHAPED,
        SHUTDOWN,
        PERSISTENCE_FAILED,
        COHORT_INCOMPLETE,
    }
)

MAX_KIND_CHARS: Final = 128
"""Longest kind accepted; a kind is a label, so anything longer is not one."""

_NAME = r"[a-z][a-z0-9_]*"
KIND_PATTERN: Final = rf"^{_NAME}(?::{_NAME})?$"
_KIND_RE = re.compile(KIND_PATTERN)
_NAME_RE = re.compile(_NAME)

_MAX_REMEMBERED_WARNINGS = 1024  # bounds memory when a producer invents names per request
_warned: set[str] = set()
_warned_lock = threading.Lock()


def is_registered(name: object) -> bool:
    """True for one of the shared names (any object may be asked: a list from a file is none)."""
    return isinstance(name, str) and name in FAILURE_KINDS


def is_namespaced(name: object) -> bool:
    """True for ``<server>:<kind>``, both halves ``[a-z][a-z0-9_]*``."""
    if not isinstance(name, str) or len(name) > MAX_KIND_CHARS:
        return False
    server, sep, kind = name.partition(":")
    return bool(sep) and _NAME_RE.fullmatch(server) is not None and _NAME_RE.fullmatch(kind) is not None


def is_well_formed(name: object) -> bool:
    """True for any name a producer may emit: registered, unregistered ``<domain>_<condition>``
    or namespaced. Only these may become a label."""
    return isinstance(name, str) and len(name) <= MAX_KIND_CHARS and _KIND_RE.fullmatch(name) is not None


def swap_warned(names: Iterable[str] = ()) -> frozenset[str]:
    """The kinds warned of once already, replaced by ``names`` (any other warns again): for
    ``ng_otel.testing``'s reset."""
    with _warned_lock:
        before = frozenset(_warned)
        _warned.clear()
        _warned.update(names)
    return before


def validate_failure_kind(name: str) -> str:
    """Return ``name`` unchanged; log a warning the first time an unregistered one is seen.

    Never raises: an unregistered name is a migration signal, not an error.
    """
    if name in FAILURE_KINDS or is_namespaced(name):
        return name
    key = name if isinstance(name, str) else repr(type(name))
    with _warned_lock:
        if key in _warned or len(_warned) >= _MAX_REMEMBERED_WARNINGS:
            return name
        _warned.add(key)
    shown = key[:MAX_KIND_CHARS]
    if is_well_formed(name):
        _log.warning("unregistered failure_kind %r: register it or namespace it as <server>:<kind>", shown)
    else:
        _log.warning("malformed failure_kind %r: expected <domain>_<condition> or <server>:<kind>", shown)
    return name
