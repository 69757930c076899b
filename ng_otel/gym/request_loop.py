"""NeMo Gym 0.7.0's request loop as a retry loop: each logical request's outcome, once.

``nemo_gym.server_utils._request_with_retries`` is Gym's one outbound path (``request`` and
``_traced_request`` call it through the module's globals). Read in the 0.7.0 wheel, it ends
in exactly two ways: an answer (``client.request`` returned, whatever the status: the loop
never looks at it), or an exception it does not retry:

- ``ServerDisconnectedError`` and ``ClientOSError`` (which ``ClientConnectorError``, a refused
  connection, is) share one count ``retries``: raised once ``_max_connection_retries`` is given
  and ``retries >= _max_connection_retries``; retried every 0.5 s forever otherwise;
- any other ``Exception``: raised once ``num_tries >= _max_connection_retries`` (when given),
  or, for a request that is not ``_internal``, once ``num_tries >= MAX_NUM_TRIES`` (3);
  ``num_tries`` grows only for requests that are not internal, so an internal request (every
  ``ServerClient`` call) retries them forever too;
- anything else (``CancelledError``) leaves at once: the caller stopped the loop, which then
  has no outcome.

The wrapper makes each call a ``RetryLoop`` the aiohttp hook finds for each failed attempt
(its resend count, and whether Gym sends again by the rule above: ``ng.retry.exhausted``),
and counts its outcome when it ends: an answer below 400 is a success, an answer of 400 or
more a failure of the kind its report names (else of its status, as ``failures`` names a
failed reply), an exception a failure of the kind of its last attempt. In rollout collection
a ``/run`` loop is a rollout in flight until it ends (``ng_otel.otel.recovery``).
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType
from typing import Any, Final

from ng_otel.contract.inner_errors import RUN_ERROR_KINDS
from ng_otel.gym.failures import STATUS_KINDS, attempt_kind
from ng_otel.integrations.hooks import rules
from ng_otel.otel._guard import guarded
from ng_otel.otel.recorder import is_enabled
from ng_otel.otel.recovery import RetryLoop, count_success, in_flight

MODULE: Final = "nemo_gym.server_utils"
FUNCTION: Final = "_request_with_retries"
RUN_PATH: Final = "/run"
GYM_MAX_NUM_TRIES: Final = 3  # server_utils.MAX_NUM_TRIES in 0.7.0, read from the module when it has one

_tracking_runs = False  # rollout collection is in this process: its /run loops are rollouts in flight


def track_runs(on: bool = True) -> None:
    """Count each ``/run`` loop of this process as a rollout in flight (collection does)."""
    global _tracking_runs
    _tracking_runs = on


def install() -> None:
    """Wrap Gym's request loop now, or as soon as ``nemo_gym.server_utils`` loads."""
    from ng_otel.gym.collection_hook import after_import

    after_import(MODULE, _wrap)


class GymRetryRule:
    """Whether 0.7.0's ``_request_with_retries`` sends again after an attempt failed with
    ``error``, kept as the loop keeps it (its ``retries`` and ``num_tries``)."""

    __slots__ = ("_connection_errors", "internal", "max_connection_retries", "max_num_tries", "num_tries", "retries")

    def __init__(
        self,
        internal: bool,
        max_connection_retries: int | None,
        connection_errors: tuple[type[BaseException], ...],
        max_num_tries: int = GYM_MAX_NUM_TRIES,
    ) -> None:
        self.internal = internal
        self.max_connection_retries = max_connection_retries
        self.max_num_tries = max_num_tries
        self._connection_errors = connection_errors
        self.num_tries = 1
        self.retries = 0

    def __call__(self, error: BaseException) -> bool:
        if isinstance(error, self._connection_errors):
            self.retries += 1
            return not (self.max_connection_retries is not None and self.retries >= self.max_connection_retries)
        if not isinstance(error, Exception):
            return False
        if self.max_connection_retries is not None and self.num_tries >= self.max_connection_retries:
            return False
        if not self.internal:
            if self.num_tries >= self.max_num_tries:
                return False
            self.num_tries += 1
        return True


def _connection_errors(module: ModuleType) -> tuple[type[BaseException], ...]:
    found = tuple(
        cls
        for cls in (getattr(module, "ServerDisconnectedError", None), getattr(module, "ClientOSError", None))
        if isinstance(cls, type) and issubclass(cls, BaseException)
    )
    if len(found) == 2:
        return found
    from aiohttp import ClientOSError, ServerDisconnectedError

    return (ServerDisconnectedError, ClientOSError)


@guarded
def _wrap(module: ModuleType) -> None:
    original = getattr(module, FUNCTION, None)
    if original is None or getattr(original, "_ng_otel_patched", False):
        return
    errors = _connection_errors(module)

    @functools.wraps(original)
    async def _request_with_retries(
        method: str,
        url: str,
        _internal: bool = False,
        _max_connection_retries: int | None = None,
        _server_name: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if not is_enabled():
            return await original(
                method,
                url,
                _internal=_internal,
                _max_connection_retries=_max_connection_retries,
                _server_name=_server_name,
                **kwargs,
            )
        max_num_tries = getattr(module, "MAX_NUM_TRIES", GYM_MAX_NUM_TRIES)
        loop = _start(GymRetryRule(_internal, _max_connection_retries, errors, max_num_tries), url)
        try:
            response = await original(
                method,
                url,
                _internal=_internal,
                _max_connection_retries=_max_connection_retries,
                _server_name=_server_name,
                **kwargs,
            )
        except Exception as error:
            _failed(loop, error)
            raise
        except BaseException:  # cancelled: the caller ended the loop, which has no outcome
            loop.ended = True
            raise
        else:
            if loop.retries == 0 and loop.kind is None and getattr(response, "status", 0) < 400:
                loop.ended = True
                count_success(loop.boundary)  # the healthy path: one dict increment
            else:
                _answered(loop, response)
            return response
        finally:
            _leave(loop)

    _request_with_retries._ng_otel_patched = True  # type: ignore[attr-defined]
    setattr(module, FUNCTION, _request_with_retries)


def _start(rule: GymRetryRule, url: Any) -> RetryLoop:
    loop = RetryLoop(rules.client_boundary, will_retry=rule).enter()
    if _tracking_runs and str(url).split("?", 1)[0].endswith(RUN_PATH):
        _rollout_started(loop)
    return loop


@guarded
def _rollout_started(loop: RetryLoop) -> None:
    in_flight().start(loop)


def _leave(loop: RetryLoop) -> None:
    loop.leave()
    if loop.rollout is not None:
        in_flight().end(loop.rollout)


@guarded
def _answered(loop: RetryLoop, response: Any) -> None:
    status = getattr(response, "status", 0)
    if not isinstance(status, int) or status < 400:
        loop.end(succeeded=True)
        return
    loop.end(succeeded=False, kind=_reply_kind(response, loop.boundary, status))


def _reply_kind(response: Any, boundary: str, status: int) -> str:
    """A failed reply's kind: the failure its report names, else its status's (``failures``)."""
    from ng_otel.integrations.aiohttp import reply_report

    report = reply_report(response, boundary=boundary)
    if report is not None and report.failure_id is not None:
        kind: str = report.events[report.failure_id]["failure_kind"]
        return kind
    return STATUS_KINDS.get(status) or RUN_ERROR_KINDS.get(boundary, RUN_ERROR_KINDS["harness"])


@guarded
def _failed(loop: RetryLoop, error: BaseException) -> None:
    kind = loop.kind if loop.exhausted and loop.kind is not None else attempt_kind(error, loop.boundary)
    loop.end(succeeded=False, kind=kind)


def installed() -> bool:
    """Whether Gym's request loop is wrapped in this process."""
    module = sys.modules.get(MODULE)
    return module is not None and getattr(getattr(module, FUNCTION, None), "_ng_otel_patched", False)
