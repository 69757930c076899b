"""Neighbouring Gym records that telemetry reads and writes, JSON-identical to upstream.

``EpisodeId`` and ``EpisodeFailure`` follow NeMo Gym 0.7.0 ``nemo_gym/episode_types.py``;
``RolloutFailureRecord`` (alias ``RolloutFailure``, 0.7.0's name) follows 0.7.0
``nemo_gym/rollout_outcomes.py``, with ``sidecar_failure_class`` and the two result errors as
Gym Main's ``nemo_gym.rollouts.rollout_outcomes`` documents them; ``VerifyOutcome`` reads the
four fields of 0.7.0 ``nemo_gym/base_resources_server.py``'s ``BaseVerifyResponse`` and the
older ``instance_config.mask_sample`` that 0.7.0 ``nemo_gym/judge.py`` still writes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal, Optional

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from typing_extensions import Self

from ng_otel.contract.events import HTTP_STATUS_MAX, HTTP_STATUS_MIN, MAX_REASON_CHARS, Stage
from ng_otel.contract.kinds import AGENT_REQUEST_FAILED, ENVIRONMENT_SERVER_FAILED, validate_failure_kind

# Keys rollout collection saves beside each result or failure row. Old rows lack them and
# keep their meaning.
ROW_EVENTS: Final = "_ng_failure_events"
ROW_FAILURE_ID: Final = "_ng_failure_id"
ROW_OMITTED: Final = "_ng_failure_events_omitted"
ROW_KEYS: Final = (ROW_EVENTS, ROW_FAILURE_ID, ROW_OMITTED)

MASK_SAMPLE: Final = "mask_sample"
INSTANCE_CONFIG: Final = "instance_config"

_ATTEMPT_SUFFIX = re.compile(r"-a[1-9][0-9]*$")


def _warn_kind(value: Optional[str]) -> Optional[str]:
    return validate_failure_kind(value) if value is not None else None


class EpisodeId(BaseModel):
    """One physical attempt of a logical rollout: ``{"rollout_id": ..., "attempt": 0}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    attempt: int = Field(default=0, ge=0)

    @field_validator("rollout_id")
    @classmethod
    def _reserve_attempt_suffix(cls, rollout_id: str) -> str:
        # The capture key appends -a<N>; an id ending in one would collide with another attempt's.
        if _ATTEMPT_SUFFIX.search(rollout_id):
            raise ValueError("rollout_id must not end with the reserved attempt suffix '-a<N>'")
        return rollout_id

    @property
    def capture_key(self) -> str:
        """The attempt-qualified key capture routes use."""
        return self.rollout_id if self.attempt == 0 else f"{self.rollout_id}-a{self.attempt}"


class EpisodeFailure(BaseModel):
    """The v1 episode failure: exactly four fields. ``failure_kind`` and ``stage`` are left out
    of dumps when unset; a ``failure_reason`` over 2000 characters is rejected, not cut. The
    ``failure_report`` travels beside it in the environment's response, never inside."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    failure_reason: str = Field(max_length=MAX_REASON_CHARS)
    terminal: bool
    failure_kind: Optional[str] = None
    stage: Optional[Stage] = None

    _warn_unregistered = field_validator("failure_kind")(_warn_kind)

    # No return annotation: it would replace the model's JSON schema, as upstream notes.
    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        result = handler(self)
        for key in ("failure_kind", "stage"):
            if result.get(key) is None:
                result.pop(key, None)
        return result


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
    http_status: Optional[int] = Field(default=None, ge=HTTP_STATUS_MIN, le=HTTP_STATUS_MAX)
    exception_type: Optional[str] = Field(default=None, max_length=2000)

    @model_validator(mode="after")
    def validate_delivery(self) -> Self:
        """Require established delivery for failures reported by the environment."""
        if self.source == "environment" and self.delivery != "delivered":
            raise ValueError("An environment-reported failure requires delivery='delivered'")
        return self

    @property
    def sidecar_failure_class(self) -> str:
        """The ``_ng_failure_class`` a failures-sidecar row gets: the failure's own kind, else
        rollout collection's class for who reported it (``environment_server_failed`` or
        ``agent_request_failed``), never an invented kind."""
        if self.failure.failure_kind is not None:
            return self.failure.failure_kind
        return ENVIRONMENT_SERVER_FAILED if self.source == "environment" else AGENT_REQUEST_FAILED


RolloutFailure = RolloutFailureRecord

_LAX_BOOL: Final = TypeAdapter(bool)


class VerifyOutcome(BaseModel):
    """The four orthogonal verify-response fields, read as ``BaseVerifyResponse`` reads them.

    ``mask_sample`` says the reward is not a valid measurement (a failure of measurement, not a
    zero score); ``failure_kind`` groups (an unregistered one warns, never rejects);
    ``failure_reason`` explains one occurrence. A sample that degraded but was validly scored
    names a kind and stays unmasked. Other fields of a verify response are ignored.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    reward: float
    mask_sample: bool = False
    failure_kind: Optional[str] = None
    failure_reason: Optional[str] = None

    _warn_unregistered = field_validator("failure_kind")(_warn_kind)

    @classmethod
    def from_response(cls, response: Any) -> VerifyOutcome:
        """Read a verify response given as a mapping or any object with those attributes.

        The top-level ``mask_sample`` decides; when it is absent (or null, as a subclass that
        redeclared it may send), the older ``instance_config.mask_sample`` does. Raises
        ``ValueError`` (pydantic's ``ValidationError``) for what ``BaseVerifyResponse`` rejects.
        """
        if isinstance(response, Mapping):
            fields = {name: response[name] for name in cls.model_fields if name in response}
            instance_config = response.get(INSTANCE_CONFIG)
        else:
            fields = {name: getattr(response, name) for name in cls.model_fields if hasattr(response, name)}
            instance_config = getattr(response, INSTANCE_CONFIG, None)
        if fields.get(MASK_SAMPLE) is None:
            fields[MASK_SAMPLE] = _older_mask_sample(instance_config)
        return cls.model_validate(fields)


def _older_mask_sample(instance_config: Any) -> bool:
    # The older location is read tolerantly: a value no bool validates is no mask.
    if isinstance(instance_config, Mapping):
        value = instance_config.get(MASK_SAMPLE)
    else:
        value = getattr(instance_config, MASK_SAMPLE, None)
    if value is None:
        return False
    try:
        return _LAX_BOOL.validate_python(value)
    except ValidationError:
        return False
