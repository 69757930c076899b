"""Neighbouring Gym contracts that telemetry reads (DESIGN 2.4).

Seeds: gym-rollout-outcomes-api.txt (``RolloutFailureRecord``), gym-pr-2611-mask-sample.txt
(verify outcomes), gym-failure-observations.txt (``EpisodeFailure`` v1 and collection rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator
from typing_extensions import Self

from ng_otel.contract.events import MAX_REASON_CHARS, Stage, bound_text
from ng_otel.contract.kinds import KIND_PATTERN, MAX_KIND_CHARS, validate_failure_kind

# Keys rollout collection saves beside each result or failure row. Old rows lack them and
# keep their meaning.
ROW_EVENTS: Final = "_ng_failure_events"
ROW_FAILURE_ID: Final = "_ng_failure_id"
ROW_OMITTED: Final = "_ng_failure_events_omitted"
ROW_KEYS: Final = (ROW_EVENTS, ROW_FAILURE_ID, ROW_OMITTED)

_Kind = Annotated[str, Field(max_length=MAX_KIND_CHARS, pattern=KIND_PATTERN)]

EpisodeId = Annotated[str, Field(min_length=1, max_length=256)]
"""An episode attempt's id: opaque, non-empty."""


class EpisodeFailure(BaseModel):
    """The v1 episode failure envelope: exactly four fields; the ``failure_report`` travels
    beside it in the environment's response, never inside."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    failure_reason: str
    terminal: StrictBool
    failure_kind: Optional[_Kind] = None
    stage: Optional[Stage] = None

    @field_validator("failure_reason")
    @classmethod
    def _bound_reason(cls, value: str) -> str:
        return bound_text(value)

    @field_validator("failure_kind")
    @classmethod
    def _warn_unregistered(cls, value: Optional[str]) -> Optional[str]:
        return validate_failure_kind(value) if value is not None else None


class InvalidRolloutResult(ValueError):
    """An agent returned a body that cannot represent a completed result."""


class StaleRolloutResult(InvalidRolloutResult):
    """A response from another attempt may be transient after a transport retry."""


class RolloutFailureRecord(BaseModel):
    """Associate one observed failure with a run and an episode attempt.

    ``source`` says who reported it (not where it happened); an environment-reported failure
    requires ``delivery="delivered"``. Frozen; unknown fields and versions are rejected, and a
    record without a version is version 1.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    episode_id: EpisodeId
    run_id: str = Field(min_length=1)
    source: Literal["environment", "collector"]
    delivery: Literal["not_sent", "possibly_delivered", "delivered"]
    failure: EpisodeFailure
    http_status: Optional[int] = Field(default=None, ge=100, le=599)
    exception_type: Optional[str] = Field(default=None, max_length=2000)

    @model_validator(mode="after")
    def validate_delivery(self) -> Self:
        """Require established delivery for failures reported by the environment."""
        if self.source == "environment" and self.delivery != "delivered":
            raise ValueError("delivery: a failure reported by the environment requires delivery='delivered'")
        return self

    @property
    def sidecar_failure_class(self) -> str:
        """Route unclassified failures without inventing a canonical failure kind."""
        return self.failure.failure_kind or "unclassified"


RolloutFailure = RolloutFailureRecord


class VerifyOutcome(BaseModel):
    """The four orthogonal verify-response fields (seed: gym-pr-2611-mask-sample.txt).

    ``mask_sample`` says the reward is not a valid measurement (a failure of measurement, not a
    zero score); ``failure_kind`` groups; ``failure_reason`` explains one occurrence. A sample
    that degraded but was validly scored names a kind and stays unmasked. Other fields of a
    verify response are ignored.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    reward: float
    mask_sample: StrictBool = False
    failure_kind: Optional[_Kind] = None
    failure_reason: Optional[str] = None

    @field_validator("failure_reason")
    @classmethod
    def _bound_reason(cls, value: Optional[str]) -> Optional[str]:
        return bound_text(value, MAX_REASON_CHARS) if value is not None else None

    @field_validator("failure_kind")
    @classmethod
    def _warn_unregistered(cls, value: Optional[str]) -> Optional[str]:
        return validate_failure_kind(value) if value is not None else None

    @classmethod
    def from_response(cls, response: Any) -> VerifyOutcome:
        """Read a verify response given as a mapping or any object with those attributes."""
        if isinstance(response, Mapping):
            return cls.model_validate(response)
        fields = {name: getattr(response, name) for name in cls.model_fields if hasattr(response, name)}
        return cls.model_validate(fields)
