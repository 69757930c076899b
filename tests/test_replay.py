"""`ng-otel replay`: no double counting, an exit status that says whether the events got where
they were sent, and bounded reading of whatever the file holds."""

import json
import socket
import subprocess
import sys
import time
import tracemalloc

import pytest

from ng_otel import NgFailureEvent, failure_report_for
from ng_otel.cli.replay import OTLP_NOT_REPLAYED
from ng_otel.contract.records import ROW_EVENTS
from ng_otel.gym.collection import ReplaySummary, replay_row, replay_rows, report_row
from ng_otel.otel import names
from ng_otel.runs.inputs import (
    MAX_LISTED_SKIPPED,
    MAX_ROW_BYTES,
    OTLP_LINE_AMONG_ROWS,
    ROW_AMONG_OTLP_LINES,
    UNDECIDED_NOT_AN_OBJECT,
)
from ng_otel.testing import capture_failures
from tests.conftest import NG_OTEL_COMMAND, user_environment


def chain_row() -> dict:
    cause = NgFailureEvent("transport_timeout", "model timed out", boundary="model")
    effect = NgFailureEvent("agent_run_error", "run failed", boundary="agent")
    effect.__cause__ = cause
    return report_row(failure_report_for(effect), contexts={})


@pytest.mark.parametrize("count", [False, True])
def test_replayed_events_are_exported_and_added_to_ng_failures_only_when_asked(count):
    with capture_failures() as telemetry:
        summary = replay_rows([chain_row(), chain_row()], count=count)
    assert summary.events_recorded == 4 and len(telemetry.failure_events()) == 4
    assert telemetry.count() == (4 if count else 0)


@pytest.mark.parametrize("bad_rows", [MAX_LISTED_SKIPPED, MAX_LISTED_SKIPPED + 1])
def test_skipped_rows_are_all_counted_and_the_first_are_kept_with_their_reason(bad_rows):
    summary = ReplaySummary()
    for line in range(1, bad_rows + 1):
        replay_row({"_ng_failure_events": 5}, line, summary)
    assert summary.skipped_rows == bad_rows
    assert [skipped.line for _, skipped in summary.skipped.listed] == list(range(1, MAX_LISTED_SKIPPED + 1))


def test_replaying_many_bad_rows_keeps_memory_flat():
    rows = ({"_ng_failure_events": {"[x]": {"event_id": "q" * 100}}} for _ in range(20_000))
    with capture_failures():
        tracemalloc.start()
        try:
            summary = replay_rows(rows)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert summary.skipped_rows == 20_000
    assert peak < 1024 * 1024, peak  # keeping every reason would take several MiB


# -- the command -----------------------------------------------------------------------------

HTTP = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(chain_row()) + "\n" + json.dumps({"healthy": True}) + "\n")
    return path


@pytest.mark.e2e
@pytest.mark.parametrize("count", [False, True])
def test_replay_says_what_the_exporter_exported_and_counts_only_when_asked(rows, otlp, ng_otel_process, count):
    done = ng_otel_process(
        "replay",
        str(rows),
        *(["--count"] if count else []),
        env={**HTTP, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.http_endpoint},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "replayed 2 rows: 1 with failures, 2 events exported, 0 failed to export, 0 skipped" in done.stdout
    assert ("not added to ng.failures" in done.stdout) is not count
    assert len(otlp.failure_events()) == 2  # the process ended: everything it exported is here
    counted = sum(point["value"] for point in otlp.metric_points(names.FAILURES_METRIC))
    assert counted == (2 if count else 0)


@pytest.mark.e2e
def test_a_file_larger_than_the_span_queue_is_exported_whole(tmp_path, otlp, ng_otel_process):
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps(chain_row()) + "\n" for _ in range(2_000)))  # a span each
    done = ng_otel_process(
        "replay",
        str(path),
        env={**HTTP, "OTEL_BSP_MAX_QUEUE_SIZE": "512", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.http_endpoint},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4000 events exported, 0 failed to export" in " ".join(done.stdout.split())
    assert len({event["ng.failure.id"] for event in otlp.failure_events()}) == 4_000


@pytest.fixture
def closed_port():
    """A port bound and never listening: connections to it are refused, and nobody else gets it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["collector down", "exporter none", "endpoint not a URL"])
def test_replay_exits_nonzero_when_the_events_do_not_get_where_they_were_sent(
    rows, ng_otel_process, closed_port, where
):
    env = {
        "collector down": {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port}"},
        "exporter none": {"OTEL_TRACES_EXPORTER": "none"},
        "endpoint not a URL": {"OTEL_EXPORTER_OTLP_ENDPOINT": "notaurl"},
    }[where]
    done = ng_otel_process("replay", str(rows), env={**HTTP, "OTEL_METRICS_EXPORTER": "none", **env})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0 events exported, 2 failed to export" in done.stdout
    assert "2 events not exported: " in done.stdout and "Traceback" not in done.stdout + done.stderr


@pytest.mark.e2e
def test_replay_with_telemetry_switched_off_says_so_on_stderr_and_exits_1(rows, ng_otel_process):
    done = ng_otel_process("replay", str(rows), env={**HTTP, "NG_OTEL_ENABLED": "0"})
    assert done.returncode == 1 and done.stdout == "", done.stdout
    assert done.stderr == "ng-otel: telemetry is disabled (NG_OTEL_ENABLED=0 or OTEL_* misconfigured)\n"


@pytest.mark.e2e
def test_the_final_flush_is_bounded_and_what_it_did_not_send_failed(rows, otlp, ng_otel_process):
    otlp.delay = 120.0  # a collector that holds every export: only the replay's own bound ends it
    started = time.monotonic()
    done = ng_otel_process(
        "replay",
        str(rows),
        "--timeout",
        "1",
        env={
            **HTTP,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "100",
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.http_endpoint,  # metrics too: held the same way
        },
    )
    # The process ends with its flush: a held metric export kept it 30 s past its summary
    # (the SDK's meter provider shutdown at exit). The start-up takes a few seconds here.
    assert time.monotonic() - started < EXIT_AFTER_FLUSH_SECONDS, done.stdout + done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0 events exported, 2 failed to export" in done.stdout
    assert "still queued when the 1 s flush ended" in done.stdout


EXIT_AFTER_FLUSH_SECONDS = 15.0  # start-up and a 1 s flush: the held export would take 30 s more


HOSTILE_KEY = "[/red][link=http://evil.example]click[/link]"


@pytest.mark.e2e
def test_replay_skips_lines_it_cannot_read_with_their_numbers_and_echoes_them_escaped(
    tmp_path, otlp, ng_otel_process, cli
):
    path = tmp_path / "hostile.jsonl"
    with path.open("wb") as out:
        out.write(json.dumps(chain_row()).encode() + b"\n")  # 1
        out.write(b'{"reason": "caf\xe9"}\n')  # 2: Latin-1, not UTF-8
        out.write(b"[" * 100_000 + b"\n")  # 3: nested past any parser's depth
        out.write(json.dumps({"_ng_failure_events": {HOSTILE_KEY: {"event_id": "q"}}}).encode() + b"\n")  # 4
        out.write(b" " * (MAX_ROW_BYTES + 1) + b"\n")  # 5: one byte past the line bound
        out.write(json.dumps(chain_row()).encode() + b"\n")  # 6
        out.write(b'{"resourceSpans": []}\n')  # 7: an OTLP JSON line, no row to replay
    done = ng_otel_process("replay", str(path), env={**HTTP, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.http_endpoint})
    assert done.returncode == 1, done.stdout + done.stderr
    out = " ".join(done.stdout.split())  # the terminal's line wrapping undone
    assert "line 2: skipped: invalid UTF-8" in out
    assert "line 3: skipped: not JSON" in out
    assert f"line 4: skipped: invalid failure report: events.{HOSTILE_KEY}" in out  # literally, never markup
    assert "line 5: skipped: longer than" in out
    assert f"line 7: skipped: {OTLP_LINE_AMONG_ROWS}" in out
    # Rows and skipped lines apart, as summary counts them.
    assert "replayed 2 rows: 2 with failures, 4 events exported, 0 failed to export, 5 skipped line(s)" in out
    assert "Traceback" not in done.stdout + done.stderr
    summary = json.loads(cli("summary", "--json", str(path)).stdout)
    assert (summary["rows"], summary["skipped"]) == (2, 5)


UNUSABLE_CONTEXTS = ["x", [1, 2], {"x": 1}, 2**70, True, 0, ""]


@pytest.mark.e2e
def test_rows_whose_contexts_cannot_be_used_are_replayed_without_links_and_counted(tmp_path, otlp, ng_otel_process):
    linked = chain_row()
    live = {event_id: f"{index + 1:032x}-{index + 1:016x}" for index, event_id in enumerate(linked[ROW_EVENTS])}
    linked[names.ROW_CONTEXTS] = live
    rows = [linked] + [chain_row() | {names.ROW_CONTEXTS: contexts} for contexts in UNUSABLE_CONTEXTS]
    path = tmp_path / "contexts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = ng_otel_process(
        "replay", "--include-live", str(path), env={**HTTP, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.http_endpoint}
    )
    assert done.returncode == 0, done.stdout + done.stderr  # every event exported: contexts only link
    out = " ".join(done.stdout.split())
    assert (
        f"{len(UNUSABLE_CONTEXTS)} row(s) had {names.ROW_CONTEXTS} that could not be used (the first, line 2: " in out
    )
    assert "replayed 8 rows: 8 with failures, 16 events exported, 0 failed to export, 0 skipped line(s)" in out
    replay_of = {
        event["ng.failure.id"]: {
            link["span_id"]
            for link in event["_span"]["links"]
            if link["attributes"].get(names.LINK_TYPE) == names.LINK_REPLAY_OF
        }
        for event in otlp.failure_events()
    }
    assert len(replay_of) == 16
    for event_id, span_ids in replay_of.items():  # a link to the live span where the contexts could be read, only
        assert span_ids == ({live[event_id][33:]} if event_id in live else set()), event_id


PEAK_RSS = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], stderr=subprocess.DEVNULL)
print("peak RSS MiB:", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
"""


@pytest.mark.e2e
def test_an_endless_line_is_skipped_with_its_number_in_flat_memory(tmp_path, otlp):
    small, endless = tmp_path / "small.jsonl", tmp_path / "endless.jsonl"
    small.write_text(json.dumps(chain_row()) + "\n")
    with endless.open("wb") as out:  # /dev/zero's shape: 512 MiB of NULs with no line end (sparse on disk)
        out.write(json.dumps(chain_row()).encode() + b"\n")
        out.truncate(out.tell() + 512 * 1024 * 1024)
        out.seek(0, 2)
        out.write(b"\n" + json.dumps(chain_row()).encode() + b"\n")
    env = user_environment(**HTTP, OTEL_EXPORTER_OTLP_ENDPOINT=otlp.http_endpoint)

    def replay(path):
        done = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, *NG_OTEL_COMMAND, "replay", str(path)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )
        out, _, peak = done.stdout.rpartition("peak RSS MiB: ")
        return " ".join(out.split()), int(peak)

    (_, baseline), (out, with_endless_line) = replay(small), replay(endless)
    assert "line 2: skipped: longer than" in out
    assert "replayed 2 rows: 2 with failures, 4 events exported, 0 failed to export, 1 skipped line(s)" in out
    # At most the line bound more than a small file, never the line's 512 MiB.
    assert with_endless_line - baseline < MAX_ROW_BYTES // (1024 * 1024) + 48, (baseline, with_endless_line)
    assert len(otlp.failure_events()) == 2 + 4


@pytest.mark.e2e
def test_a_file_of_otlp_json_lines_is_not_replayed_and_a_row_in_it_is_skipped_as_summary_skips_it(
    tmp_path, otlp, ng_otel_process, cli
):
    path = tmp_path / "otlp_first.jsonl"
    path.write_text('[1]\n{"resourceSpans": []}\n' + json.dumps(chain_row()) + "\n")  # the object decides
    done = ng_otel_process("replay", str(path), env={**HTTP, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.http_endpoint})
    assert done.returncode == 1, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert f"line 1: skipped: {UNDECIDED_NOT_AN_OBJECT}" in out
    assert f"line 2: skipped: {OTLP_NOT_REPLAYED}" in out and f"line 3: skipped: {ROW_AMONG_OTLP_LINES}" in out
    assert "replayed 0 rows: 0 with failures, 0 events exported, 0 failed to export, 3 skipped line(s)" in out
    summary = json.loads(cli("summary", "--json", str(path)).stdout)
    assert summary["skipped"] == 2  # the list and the row; the OTLP line is summary's to read
