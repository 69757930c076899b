"""NeMo Gym's own records as telemetry: saved rollout rows and their replay
(``ng_otel.gym.collection``), handled episode failures, episode responses and verify
outcomes (``ng_otel.gym.episodes``). Beside the framework adapters, not among them: these
read Gym's data, not a web framework's."""

__all__ = ["collection", "episodes"]
