"""After-the-run analysis as a library: what the command line's ``summary``, ``report``,
``show``, ``replay`` and ``kinds --check`` read, for a notebook or a script.

    from pathlib import Path
    from ng_otel.runs import summarise

    figures = summarise([Path("results/rollouts.jsonl")]).to_json()  # its sidecar and inputs too
    figures["by_kind"]          # {"agent_run_error": 41, "provider_unavailable": 41, ...}
    figures["root_causes"][0]   # {"failure_kind": "provider_unavailable", "server": "policy_model",
                                #  "reason": "backend overloaded", "count": 41}
    figures["coverage"]         # {"expected": 1280, "measured": 1201, "masked": 35, "failed": 41,
                                #  "omitted": 0, "unknown": 3}
    figures["unknown_rollouts"] # [{"run": "results/rollouts.jsonl", "task_index": 17, "rollout_index": 2}, ...]

The layers: ``inputs`` (files, formats, skipped lines: the one loop), ``otlp`` (OTLP JSON
lines' ``ng.failure`` events), ``chains`` (failure groups to draw or walk), ``summary`` (the
figures), ``kinds`` (kinds to fix), ``coverage`` (a Gym run's coverage account). Nothing here
prints: drawing is the command line's.
"""

from ng_otel.runs.chains import FailureGroup, groups_from_lines
from ng_otel.runs.inputs import SkippedLine, file_lines, formatted_lines, read_json_lines
from ng_otel.runs.kinds import KindCheck
from ng_otel.runs.summary import Summary, summarise

__all__ = [
    "FailureGroup",
    "KindCheck",
    "SkippedLine",
    "Summary",
    "file_lines",
    "formatted_lines",
    "groups_from_lines",
    "read_json_lines",
    "summarise",
]
