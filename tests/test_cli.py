"""The command line: ``main(argv)`` in this process where the command is a function of files
and environment (``cli``); ``ng-otel`` in a process of its own where the process matters (replay
flushes its exporters as it exits); and the demo from the installed wheel, from a user's folder."""

import json
from pathlib import Path

import pytest

from ng_otel.cli.receiver import OtlpReceiver
from ng_otel.runs.inputs import OTLP_LINE_AMONG_ROWS, ROW_AMONG_OTLP_LINES
from ng_otel.runs.otlp import INVALID_OTLP_EVENT


@pytest.fixture(scope="module")
def demo(ng_otel_cli, tmp_path_factory):  # the installed command, run from a folder of its own
    folder = tmp_path_factory.mktemp("a-users-folder")
    done = ng_otel_cli("demo", cwd=folder)  # no --out: under the current folder
    out = folder / "ng-otel-demo"
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, out


def live_events(telemetry: Path):
    """(event id -> span id, caused_by links as (effect id, cause span id)) from OTLP JSON."""
    where, links = {}, set()
    for line in telemetry.read_text().splitlines():
        for resource in json.loads(line).get("resourceSpans", []):
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    for event in span.get("events", []):
                        if event["name"] == "ng.failure":
                            attrs = {a["key"]: a["value"] for a in event["attributes"]}
                            assert attrs["ng.failure.id"]["stringValue"] not in where, "exported twice"
                            where[attrs["ng.failure.id"]["stringValue"]] = span["spanId"]
                    for link in span.get("links", []):
                        attrs = {a["key"]: a["value"]["stringValue"] for a in link["attributes"]}
                        if attrs.get("ng.link.type") == "caused_by":
                            links.add((attrs["ng.failure.id"], link["spanId"]))
    return where, links


@pytest.mark.e2e
def test_demo_prints_every_chain_as_a_tree_and_saves_the_rows(demo):
    stdout, out = demo
    lines = [line.rstrip() for line in stdout.splitlines()]
    start = next(i for i, line in enumerate(lines) if "scenario model_timeout" in line)
    tree = "\n".join(lines[start + 1 : start + 7])
    assert (
        tree.index("agent_run_error  agent")
        < tree.index("agent_run_error  harness")
        < tree.index("transport_timeout  model")
    )
    assert "└── transport_timeout  model · stage agent · 504" in tree
    assert "judge call failed  via ng_otel.cli.demo_stack.servers.JudgeSdkError" in stdout
    assert "report omitted" in stdout
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [(row["scenario"], row["status"]) for row in rows] == [
        ("model_timeout", 500),
        ("retry_recovered", 200),
        ("judge_failed", 500),
        ("masked", 200),
        ("oversized", 500),
        ("foreign_between", 500),
        ("malformed_header", 200),
        ("ok", 200),
    ]
    for row in rows:
        assert row["trace_id"][:16] in stdout
    assert f"rows: {out / 'rows.jsonl'}" in stdout


@pytest.mark.e2e
def test_demo_telemetry_is_otlp_json_with_hex_ids_and_each_event_once(demo):
    _, out = demo
    where, links = live_events(out / "telemetry.jsonl")
    saved = set()
    for line in (out / "rows.jsonl").read_text().splitlines():
        saved |= set(json.loads(line).get("_ng_failure_events", {}))
    assert saved <= set(where)
    assert all(len(span_id) == 16 and int(span_id, 16) for span_id in where.values())
    assert len(links) >= 3


@pytest.mark.e2e
def test_replay_of_the_demo_rows_gives_the_same_chains_as_the_live_run(demo, ng_otel_process):
    _, out = demo
    live_where, live_links = live_events(out / "telemetry.jsonl")
    receiver = OtlpReceiver().start()
    try:
        done = ng_otel_process(
            "replay",
            "--include-live",  # a receiver that did not see the live run
            str(out / "rows.jsonl"),
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_METRICS_EXPORTER": "none",
            },
        )
        assert done.returncode == 0, done.stdout + done.stderr
        replay_path = out / "replay.jsonl"
        receiver.write_jsonl(replay_path)
    finally:
        receiver.stop()
    saved = {}
    for line in (out / "rows.jsonl").read_text().splitlines():
        saved |= json.loads(line).get("_ng_failure_events", {})
    replay_where, replay_links = live_events(replay_path)  # asserts no event is exported twice
    assert set(replay_where) == set(saved)
    # The same cause links: live (effect, cause span) maps to replay through the event ids.
    live_span_event = {span: event for event, span in live_where.items()}
    live_shape = {(effect, live_span_event.get(span)) for effect, span in live_links if effect in saved}
    replay_span_events = {}
    for event, span in replay_where.items():
        replay_span_events.setdefault(span, set()).add(event)
    replay_shape = {
        (effect, cause)
        for effect, span in replay_links
        for cause in replay_span_events[span]
        if saved[effect].get("cause_id") == cause
    }
    assert live_shape == replay_shape and len(replay_shape) >= 3
    closing = " ".join(done.stdout.split())
    assert f"replayed 8 rows: 7 with failures, {len(saved)} events exported, 0 failed to export, 0 skipped" in closing


FIXTURE_ROWS = [
    {
        "scenario": "a",
        "_ng_failure_id": "e2",
        "_ng_failure_events": {
            "e1": {
                "event_id": "e1",
                "boundary": "model",
                "failure_kind": "transport_timeout",
                "failure_reason": "slow",
            },
            "e2": {
                "event_id": "e2",
                "boundary": "agent",
                "failure_kind": "agent_run_error",
                "failure_reason": "boom \x1b[31mRED\x1b[0m [bold]markup[/bold]",
                "cause_id": "e1",
            },
        },
    },
    {
        "scenario": "b",
        "_ng_failure_events": {
            "e3": {
                "event_id": "e3",
                "boundary": "environment",
                "failure_kind": "browser_crashed",
                "failure_reason": "x",
            },
            "e4": {
                "event_id": "e4",
                "boundary": "environment",
                "failure_kind": "swe:patch_failed",
                "failure_reason": "y",
            },
        },
    },
    {"scenario": "healthy", "result": 1},
]


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    lines = [json.dumps(row) for row in FIXTURE_ROWS]
    lines.insert(2, "{not json")
    lines.append(json.dumps({"_ng_failure_events": {"z": {"event_id": "q"}}}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_show_draws_trees_filters_and_reports_bad_lines_with_their_numbers(rows_file, cli):
    done = cli("show", str(rows_file))
    assert done.returncode == 0
    assert "line 1 · scenario a" in done.stdout and "line 2 · scenario b" in done.stdout
    assert "\x1b" not in done.stdout and "[bold]markup[/bold]" in done.stdout
    assert "line 3: skipped: not JSON" in done.stdout
    assert "line 5: skipped: invalid failure report: events.z" in done.stdout
    only = cli("show", str(rows_file), "--kind", "transport_timeout")
    assert "scenario a" in only.stdout and "scenario b" not in only.stdout
    by_boundary = cli("show", str(rows_file), "--boundary", "environment")
    assert "scenario b" in by_boundary.stdout and "scenario a" not in by_boundary.stdout


def test_show_limit_stops_after_n_groups_and_full_ids_print_ids_jaeger_can_search(rows_file, tmp_path, cli):
    limited = cli("show", str(rows_file), "--limit", "1")
    assert limited.returncode == 0
    assert "scenario a" in limited.stdout and "scenario b" not in limited.stdout
    assert "1 failure chain group(s) shown" in limited.stdout and "--limit" in limited.stdout
    event_id = "0123456789abcdef" * 2
    row = {
        "_ng_failure_id": event_id,
        "_ng_failure_events": {event_id: {**FIXTURE_ROWS[0]["_ng_failure_events"]["e1"]}},
    }
    row["_ng_failure_events"][event_id]["event_id"] = event_id
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(row) + "\n")
    short = cli("show", str(path))
    assert event_id[:12] in short.stdout and event_id not in short.stdout
    full = cli("show", str(path), "--full-ids")
    assert full.stdout.splitlines()[1].endswith(event_id)


def test_kinds_lists_the_vocabulary_and_check_finds_unregistered_kinds(rows_file, cli):
    listing = cli("kinds")
    assert listing.returncode == 0 and "24 shared failure kinds" in listing.stdout
    assert "cohort_incomplete" in listing.stdout
    check = cli("kinds", "--check", str(rows_file))
    assert check.returncode == 1
    assert "browser_crashed" in check.stdout and "swe:patch_failed" not in check.stdout


def table_row(*cells: str) -> str:
    """The first cells of a row of a rich table, as it reads with the terminal's spacing undone."""
    return "│ " + " │ ".join(cells) + " │"


def test_kinds_check_lists_malformed_kinds_and_the_lines_it_could_not_check(tmp_path, cli):
    path = tmp_path / "rows.jsonl"
    record = {"event_id": "e1", "boundary": "model", "failure_kind": "Transport-Timeout", "failure_reason": "slow"}
    saved = {"_ng_failure_id": "e1", "_ng_failure_events": {"e1": record}}
    lines = [
        json.dumps({"_ng_failure_class": "TransportTimeout"}),  # 0.7.0's class, malformed
        json.dumps(saved),  # a saved report's kind, malformed
        "{not json",  # could hold any kind
        json.dumps({"_ng_failure_class": "transport_timeout"}),
        json.dumps({"resourceSpans": []}),  # OTLP among rows: a skipped line, as show and summary say
    ]
    path.write_text("\n".join(lines) + "\n")
    done = cli("kinds", "--check", str(path))
    assert done.returncode == 1, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert table_row("TransportTimeout", "malformed", "1", "1") in out
    assert table_row("Transport-Timeout", "malformed", "1", "2") in out
    assert "line 3: skipped: not JSON" in out and f"line 5: skipped: {OTLP_LINE_AMONG_ROWS}" in out
    assert "2 line(s) of" in out
    assert "line 1: skipped" not in out and "line 2: skipped" not in out  # listed as malformed, not as skipped
    assert "every failure_kind" not in out


def test_kinds_check_takes_several_files_and_says_which_each_kind_is_in(tmp_path, cli):
    rows, sidecar = tmp_path / "rows.jsonl", tmp_path / "rows_failures.jsonl"
    rows.write_text(json.dumps({"_ng_failure_class": "transport_timeout"}) + "\n{not json\n")
    sidecar.write_text("\n".join(json.dumps({"_ng_failure_class": kind}) for kind in ("made_up", "Bad-Kind")) + "\n")
    done = cli("kinds", "--check", str(rows), str(sidecar))
    assert done.returncode == 1, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert table_row("made_up", "unregistered", "1", f"{sidecar}:1") in out
    assert table_row("Bad-Kind", "malformed", "1", f"{sidecar}:2") in out
    assert f"{rows}:2: skipped: not JSON" in out and f"1 line(s) of {rows}, {sidecar} could not be checked" in out
    both_clean = cli("kinds", "--check", str(rows.with_name("a.jsonl")), str(rows.with_name("b.jsonl")))
    assert both_clean.returncode == 2 and "a.jsonl: no such file" in both_clean.stderr


@pytest.mark.e2e
def test_kinds_check_reads_the_kinds_of_otlp_json_lines(demo, tmp_path, cli):
    _, out = demo
    telemetry = (out / "telemetry.jsonl").read_text()
    clean = cli("kinds", "--check", str(out / "telemetry.jsonl"))
    assert clean.returncode == 0 and "is registered or namespaced" in clean.stdout, clean.stdout + clean.stderr
    # Every export twice (a retried export), then a row: each event is counted once, as summary
    # counts it, and the row is a line of the other format.
    made_up = tmp_path / "made_up.jsonl"
    made_up.write_text(2 * telemetry.replace('"transport_timeout"', '"made_up_kind"') + '{"a": "row"}\n')
    done = cli("kinds", "--check", str(made_up))
    assert done.returncode == 1, done.stdout + done.stderr
    events = json.loads(cli("summary", "--json", str(out / "telemetry.jsonl")).stdout)["by_kind"]
    checked = " ".join(done.stdout.split())
    assert table_row("made_up_kind", "unregistered", str(events["transport_timeout"])) in checked
    assert f"skipped: {ROW_AMONG_OTLP_LINES}" in checked
    # An OTLP event whose kind no row could hold is a skipped line, as in show and summary.
    malformed = tmp_path / "malformed.jsonl"
    malformed.write_text(telemetry.replace('"transport_timeout"', '"Transport-Timeout"'))
    done = cli("kinds", "--check", str(malformed))
    assert done.returncode == 1 and f"skipped: {INVALID_OTLP_EVENT}" in " ".join(done.stdout.split())


@pytest.mark.parametrize("name", ["[/x].jsonl", "[red]x.jsonl", "esc\x1b[31mRED.jsonl"])
def test_kinds_check_prints_a_file_name_literally(tmp_path, cli, name):
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"_ng_failure_class": "transport_timeout"}) + "\n")
    done = cli("kinds", "--check", name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    shown = name.replace("\x1b", "\N{REPLACEMENT CHARACTER}")  # no escape sequence reaches the terminal
    assert f"every failure_kind in {shown} is registered or namespaced" in done.stdout


@pytest.mark.e2e
def test_replay_reports_bad_rows_and_exits_nonzero(rows_file, otlp, ng_otel_process):
    done = ng_otel_process(
        "replay",
        str(rows_file),
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.http_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_METRICS_EXPORTER": "none",
        },
    )
    assert done.returncode == 1
    assert "line 3: skipped: not JSON" in done.stdout and "line 5: skipped" in done.stdout
    closing = " ".join(done.stdout.split())
    assert "replayed 3 rows: 2 with failures, 4 events exported, 0 failed to export, 2 skipped line(s)" in closing
    assert otlp.wait_for(lambda: len(otlp.failure_events()) == 4)


# A name rich would read as markup, with an escape sequence a terminal would obey.
HOSTILE_NAME = "[/x]esc\x1b[31mRED.jsonl"


@pytest.mark.parametrize(
    "command", [["show"], ["kinds", "--check"], ["replay"], ["summary"], ["report", "-o", "report.html"]]
)
def test_a_missing_file_is_one_line_on_stderr_naming_it_literally(tmp_path, cli, command):
    done = cli(*command, HOSTILE_NAME, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    shown = HOSTILE_NAME.replace("\x1b", "\N{REPLACEMENT CHARACTER}")
    assert done.stdout == "" and done.stderr == f"ng-otel: {shown}: no such file\n"


@pytest.mark.parametrize("limit", ["-1", "x", "1.5"])
def test_show_limit_says_what_it_takes(rows_file, cli, limit):
    done = cli("show", str(rows_file), "--limit", limit)
    assert done.returncode == 2 and done.stdout == ""
    assert f"argument --limit: expected a whole number, 0 or more, not '{limit}'" in done.stderr
    nothing = cli("show", str(rows_file), "--limit", "0")  # 0 is taken, as before: no tree
    assert nothing.returncode == 0 and "0 failure chain group(s) shown" in nothing.stdout


def test_kinds_check_keeps_a_bounded_table_of_endless_distinct_kinds(tmp_path, monkeypatch):
    from ng_otel.runs import kinds

    monkeypatch.setattr(kinds, "MAX_LISTED_KINDS", 3)  # small enough to pass; the default is 1,000
    path = tmp_path / "kinds.jsonl"
    path.write_bytes(b"".join(json.dumps({"_ng_failure_class": f"made_up_{n}"}).encode() + b"\n" for n in range(10)))
    found = kinds.KindCheck()
    found.read(path)
    assert len(found.kinds) == 4 and sum(found.kinds.values()) == 10  # three by name, the rest as _other
    assert found.kinds[("_other", kinds.UNREGISTERED)] == 7


@pytest.mark.parametrize("command", [["show"], ["summary"], ["summary", "--json"], ["kinds", "--check"], ["replay"]])
def test_a_device_is_refused_at_once_instead_of_read_forever(cli, command):
    # /dev/zero never ends and holds no newline: every reader went on forever, in flat memory.
    done = cli(*command, "/dev/zero")
    assert done.returncode == 2 and done.stderr == "ng-otel: /dev/zero: a device, not a file of rows\n", done.stderr
