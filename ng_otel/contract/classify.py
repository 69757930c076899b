"""INFRA vs DATA: which failures are the fleet's and which are the request's.

As NeMo-RL's ``nemo_rl/experience/failures.py`` decides it: 5xx and the retriable 4xx (408,
429; ``http_status_is_infra``) are infrastructure; any other status describes the request; a
terminal episode failure is DATA (the environment decided another attempt would not help);
anything unrecognised is DATA, so an unexpected failure surfaces loudly instead of being
retried into silence. The classification lives apart from the vocabulary (the registry
carries no policy), and a user can supply their own ``FailureClassifier``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

from ng_otel.contract import kinds as k


class FailureClass(str, enum.Enum):
    """Retry policy bucket for a failure."""

    INFRA = "infra"
    DATA = "data"


RETRIABLE_HTTP_STATUSES: Final[frozenset[int]] = frozenset({408, 429})
INFRA_KIND_PREFIXES: Final[tuple[str, ...]] = ("transport_", "provider_", "session_")
INFRA_KINDS: Final[frozenset[str]] = frozenset(
    {
        k.AGENT_TIMEOUT,
        k.AGENT_REQUEST_FAILED,
        k.ENVIRONMENT_SERVER_FAILED,
        k.JUDGE_FAILED,
        k.KILL_SHAPED,
        k.SHUTDOWN,
        k.CANCELLED,
        k.PERSISTENCE_FAILED,
        k.COHORT_INCOMPLETE,
    }
)


def http_status_is_infra(status: int) -> bool:
    """Whether an HTTP status means the endpoint is unwell rather than the request bad."""
    return status >= 500 or status in RETRIABLE_HTTP_STATUSES


@dataclass(frozen=True)
class FailureClassifier:
    """Classify a terminal episode failure as DATA; otherwise by the event's ``http_status``
    when present, else by its kind."""

    infra_kinds: frozenset[str] = INFRA_KINDS
    infra_kind_prefixes: tuple[str, ...] = INFRA_KIND_PREFIXES
    retriable_statuses: frozenset[int] = field(default=RETRIABLE_HTTP_STATUSES)

    def classify(
        self, failure_kind: str | None, http_status: int | None = None, *, terminal: bool = False
    ) -> FailureClass:
        if terminal:
            return FailureClass.DATA
        if http_status is not None:
            infra = http_status >= 500 or http_status in self.retriable_statuses
            return FailureClass.INFRA if infra else FailureClass.DATA
        if failure_kind is None:
            return FailureClass.DATA
        if failure_kind in self.infra_kinds:
            return FailureClass.INFRA
        # Namespaced kinds contain ':' and never match a shared prefix's domain.
        if ":" not in failure_kind and failure_kind.startswith(self.infra_kind_prefixes):
            return FailureClass.INFRA
        return FailureClass.DATA


DEFAULT_CLASSIFIER: Final = FailureClassifier()


def classify_failure(
    failure_kind: str | None, http_status: int | None = None, *, terminal: bool = False
) -> FailureClass:
    """``DEFAULT_CLASSIFIER.classify``: INFRA or DATA for one failure's kind, status and
    terminal decision (an ``EpisodeFailure``'s ``terminal``)."""
    return DEFAULT_CLASSIFIER.classify(failure_kind, http_status, terminal=terminal)
