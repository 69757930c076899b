"""Header codec round trip of a 10-event report vs plain json.dumps/json.loads of the same dict.

Target: at most 2.0x. Run: .venv/bin/python bench/codec.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _measure import per_call_seconds, report

from ng_otel.contract import FailureReport, NgFailureEvent, failure_report_for


def ten_event_report() -> FailureReport:
    error: BaseException | None = None
    for index in range(10):
        event = NgFailureEvent(
            "transport_timeout" if index == 0 else "agent_run_error",
            f"attempt {index} failed after 30s waiting for the model server",
            boundary="model" if index == 0 else "agent",
            stage="agent",
            http_status=504,
            operation="chat_completions",
        )
        if error is not None:
            event.__cause__ = error
        error = event
    assert error is not None
    result = failure_report_for(error)
    assert result is not None and len(result) == 10
    return result


def main() -> bool:
    payload = ten_event_report()
    as_dict = payload.to_dict()

    def codec() -> object:
        return FailureReport.from_header(payload.to_header())

    def plain() -> object:
        return json.loads(json.dumps(as_dict, separators=(",", ":")))

    times = per_call_seconds({"codec": codec, "plain": plain}, number=2000)
    return report("header codec round trip, 10 events", times["codec"], times["plain"], target=2.0)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
