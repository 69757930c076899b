"""Write docs/api.md from the docstrings of the public names (what `ng_otel.__all__` and the adapters export).

Run: .venv/bin/python tools/gen_api.py   (tests/test_api_docs.py fails when it is stale)
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "api.md"

PUBLIC: dict[str, list[str]] = {
    "ng_otel": [
        "NgFailureEvent",
        "ForeignError",
        "FailureReport",
        "failure_report_for",
        "rebuild_failure",
        "find_boundary_failure",
        "validate_failure_kind",
        "FAILURE_KINDS",
        "enable",
        "record_failure",
        "observe_failure",
    ],
    "ng_otel.integrations": ["instrument_app"],
    "ng_otel.integrations.asgi": ["FailureReportMiddleware"],
    "ng_otel.integrations.aiohttp": [
        "failure_trace_config",
        "raise_boundary_failure",
        "reply_report",
        "failure_report_middleware",
        "HttpError",
    ],
    "ng_otel.gym.collection": ["report_row", "row_report", "replay_rows"],
    "ng_otel.gym.episodes": ["handled_episode_failure", "episode_response", "record_verify_outcome"],
    "ng_otel.runs": ["summarise", "Summary", "groups_from_lines", "FailureGroup", "KindCheck", "read_json_lines"],
    "ng_otel.runs.coverage": ["run_coverage", "read_run_coverage", "run_files", "RunCoverage", "CoverageAccount"],
    "ng_otel.testing": ["capture_failures", "CapturedTelemetry", "fresh_state", "reset_state"],
    "ng_otel.pytest_plugin": ["ng_otel_capture"],
}


WITH_MODULE_DOC = {"ng_otel.runs"}  # a library whose use its module docstring shows


def members(cls: type) -> list[tuple[str, object]]:
    own = []
    for name, value in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            own.append((name, value))
    return own


def signature(obj: object) -> str:
    try:
        return str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""


def render() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `tools/gen_api.py`; the public names of the package and its adapters.",
        "",
    ]
    for module_name, public in PUBLIC.items():
        module = importlib.import_module(module_name)
        lines += [f"## `{module_name}`", ""]
        if module_name in WITH_MODULE_DOC:
            lines += [inspect.getdoc(module) or "", ""]
        for name in public:
            obj = getattr(module, name)
            obj = getattr(obj, "__wrapped__", obj)  # pytest fixtures and guarded functions
            if isinstance(obj, (frozenset, set)):
                lines += [
                    f"### `{name}`",
                    "",
                    f"A frozenset of {len(obj)} names: the shared failure-kind vocabulary.",
                    "",
                ]
                continue
            kind = "class" if inspect.isclass(obj) else "def"
            lines += [f"### `{kind} {name}{signature(obj)}`", "", inspect.getdoc(obj) or "", ""]
            if inspect.isclass(obj):
                for member, value in members(obj):
                    doc = inspect.getdoc(value)
                    if doc and member != "__init__":
                        label = member if isinstance(value, property) else f"{member}{signature(value)}"
                        summary = " ".join(doc.split("\n\n")[0].split())
                        lines += [f"- `{label}`: {summary}"]
                lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
