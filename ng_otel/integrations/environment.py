"""Moved to ``ng_otel.gym.episodes``; this import path keeps working."""

from ng_otel.gym.episodes import episode_response, handled_episode_failure, record_verify_outcome

__all__ = ["episode_response", "handled_episode_failure", "record_verify_outcome"]
