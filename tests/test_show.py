"""`ng-otel show` on files a run did not write as expected: hostile OTLP attribute values, cause
cycles, deep chains, lines of the other format, hostile file names, and a terminal."""

import io
import json
from pathlib import Path

from rich.console import Console

from ng_otel.cli.show import show_paths


def show_output(*paths: Path, terminal: bool = False) -> str:
    """What ``ng-otel show`` prints for ``paths``, as a pipe (or a terminal) gets it."""
    out = io.StringIO()
    assert show_paths(paths, Console(file=out, width=200, force_terminal=terminal)) == 0
    return out.getvalue()


def otlp_event(event_id: str, *, cause: dict | None = None, kind: str = "transport_timeout") -> dict:
    """An ``ng.failure`` span event as OTLP JSON; ``cause`` is its cause id's OTLP value."""
    attributes = [
        {"key": "ng.failure.id", "value": {"stringValue": event_id}},
        {"key": "ng.failure.kind", "value": {"stringValue": kind}},
        {"key": "ng.failure.boundary", "value": {"stringValue": "model"}},
        {"key": "ng.failure.reason", "value": {"stringValue": f"reason of {event_id}"}},
    ]
    if cause is not None:
        attributes.append({"key": "ng.failure.cause_id", "value": cause})
    return {"name": "ng.failure", "attributes": attributes}


def otlp_line(trace_id: str, *events: dict) -> str:
    span = {"traceId": trace_id, "spanId": "s" + trace_id, "events": list(events)}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


# -- OTLP attribute values ------------------------------------------------------------------


def test_a_cause_id_that_is_not_a_string_is_no_cause_and_its_event_still_shows(tmp_path):
    path = write_lines(
        tmp_path / "telemetry.jsonl",
        otlp_line(
            "t1",
            otlp_event("e1", cause={"stringValue": ["x"]}),
            otlp_event("e2", cause={"boolValue": ["x"]}),
            otlp_event("e3", cause={"doubleValue": {"x": 1}}),
            otlp_event("e4", cause={"boolValue": True}),
        ),
    )
    # Each is the top of a chain of its own, drawn with its reason: no traceback, no event lost.
    assert show_output(path).splitlines()[:-1] == [
        "trace t1",
        "├── transport_timeout  model · ?  e1",
        "│   reason of e1",
        "├── transport_timeout  model · ?  e2",
        "│   reason of e2",
        "├── transport_timeout  model · ?  e3",
        "│   reason of e3",
        "└── transport_timeout  model · ?  e4",
        "    reason of e4",
    ]


# -- loops of causes ------------------------------------------------------------------------


def cause(event_id: str) -> dict:
    return {"stringValue": event_id}


def test_a_loop_of_causes_in_one_trace_or_across_two_is_drawn_once_with_a_marker(tmp_path):
    two = write_lines(
        tmp_path / "two.jsonl",
        otlp_line("t1", otlp_event("e1", cause=cause("e2")), otlp_event("e2", cause=cause("e1"))),
    )
    one = write_lines(tmp_path / "one.jsonl", otlp_line("t1", otlp_event("e1", cause=cause("e1"))))
    across = write_lines(
        tmp_path / "across.jsonl",
        otlp_line("t1", otlp_event("e1", cause=cause("e2"))),
        otlp_line("t2", otlp_event("e2", cause=cause("e1"))),
    )
    loop_of_two = [
        "└── transport_timeout  model · ?  e1",
        "    reason of e1",
        "    └── transport_timeout  model · ?  e2",
        "        reason of e2",
        "        └── ↻ cause e1 already shown above",
    ]
    assert show_output(two).splitlines()[:-1] == ["trace t1", *loop_of_two]
    assert show_output(across).splitlines()[:-1] == ["traces t1 + t2", *loop_of_two]
    assert show_output(one).splitlines()[:-1] == [
        "trace t1",
        "└── transport_timeout  model · ?  e1",
        "    reason of e1",
        "    └── ↻ cause e1 already shown above",
    ]


def test_a_loop_under_a_top_and_a_shared_cause_end_their_chains_with_the_marker(tmp_path):
    path = write_lines(
        tmp_path / "telemetry.jsonl",
        otlp_line(
            "t1",
            otlp_event("e0", cause=cause("e1")),
            otlp_event("e1", cause=cause("e2")),
            otlp_event("e2", cause=cause("e1")),
            otlp_event("e9", cause=cause("e2")),
        ),
    )
    assert show_output(path).splitlines()[:-1] == [
        "trace t1",
        "├── transport_timeout  model · ?  e0",
        "│   reason of e0",
        "│   └── transport_timeout  model · ?  e1",
        "│       reason of e1",
        "│       └── transport_timeout  model · ?  e2",
        "│           reason of e2",
        "│           └── ↻ cause e1 already shown above",
        "└── transport_timeout  model · ?  e9",
        "    reason of e9",
        "    └── ↻ cause e2 already shown above",
    ]


# -- deep chains ----------------------------------------------------------------------------


def write_deep_chain(path: Path, depth: int) -> Path:
    """One saved row whose report is a chain of ``depth`` events, its root a kind of its own."""
    events = {
        f"e{index}": {
            "event_id": f"e{index}",
            "boundary": "model",
            "failure_kind": "transport_timeout" if index < depth - 1 else "browser_crashed",
            "failure_reason": f"reason {index}",
            **({"cause_id": f"e{index + 1}"} if index < depth - 1 else {}),
        }
        for index in range(depth)
    }
    return write_lines(path, json.dumps({"_ng_failure_id": "e0", "_ng_failure_events": events}))


def test_output_grows_linearly_with_chain_depth_and_still_reaches_the_root(tmp_path):
    shallow = show_output(write_deep_chain(tmp_path / "shallow.jsonl", 2_000))
    deep = show_output(write_deep_chain(tmp_path / "deep.jsonl", 4_000))
    # Twice the events, about twice the text; nesting every level would make it four times.
    assert len(deep) / len(shallow) < 3
    assert "browser_crashed  model  e3999" in deep and "reason 3999" in deep
    assert "the 3968 cause(s) below are drawn flat" in deep


# -- which format a file is -----------------------------------------------------------------


def saved_row(event_id: str) -> str:
    record = {"event_id": event_id, "boundary": "agent", "failure_kind": "agent_run_error", "failure_reason": "r"}
    return json.dumps({"_ng_failure_id": event_id, "_ng_failure_events": {event_id: record}})


def test_the_first_decoded_line_decides_the_format_and_lines_of_the_other_are_skipped(tmp_path):
    from ng_otel.runs.inputs import OTLP_LINE_AMONG_ROWS, ROW_AMONG_OTLP_LINES

    otlp_after_junk = write_lines(
        tmp_path / "telemetry.jsonl",
        "not json",
        otlp_line("t1", otlp_event("e1")),
        saved_row("r1"),
        "[1]",
    )
    shown = show_output(otlp_after_junk)
    assert "trace t1\n└── transport_timeout  model · ?  e1" in shown  # read as OTLP, not as rows
    assert "1 failure chain group(s) shown" in shown
    assert "line 1: skipped: not JSON" in shown
    assert f"line 3: skipped: {ROW_AMONG_OTLP_LINES}\n" in shown
    assert f"line 4: skipped: {ROW_AMONG_OTLP_LINES}\n" in shown

    rows_with_otlp = write_lines(tmp_path / "rows.jsonl", saved_row("r1"), otlp_line("t1", otlp_event("e1")))
    shown = show_output(rows_with_otlp)
    assert "line 1\n└── agent_run_error  agent  r1" in shown and "e1" not in shown
    assert f"line 2: skipped: {OTLP_LINE_AMONG_ROWS}\n" in shown


# -- file names -----------------------------------------------------------------------------


def test_file_names_print_literally_with_control_characters_replaced(tmp_path, cli):
    (tmp_path / "[").mkdir()
    names = ["[/x].jsonl", "[red]x.jsonl", "esc\x1b[31mRED.jsonl", "back\\"]
    for name in names[:3]:
        write_lines(tmp_path / name, saved_row("r1"))
    (tmp_path / names[3]).write_text("")  # empty: its own line, "no rows"
    done = cli("show", *names, cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "\x1b" not in done.stdout  # no escape sequence of a name reaches the terminal
    closing = [line for line in done.stdout.splitlines() if "shown from" in line or "no rows" in line]
    assert closing == [
        "1 failure chain group(s) shown from [/x].jsonl",
        "1 failure chain group(s) shown from [red]x.jsonl",
        "1 failure chain group(s) shown from esc\N{REPLACEMENT CHARACTER}[31mRED.jsonl",
        "back\\: no rows",
    ]


def test_the_progress_bar_prints_a_file_name_literally(tmp_path, monkeypatch):
    from ng_otel.cli import _progress
    from ng_otel.cli.summary import summarise_files

    path = write_lines(tmp_path / "esc\x1b[31m[red]RED.jsonl", saved_row("r1"))
    monkeypatch.setattr(_progress, "PROGRESS_AFTER", 0.0)  # the bar at once: summary keeps its bar
    terminal = io.StringIO()
    summarise_files([path], Console(file=terminal, force_terminal=True, width=200))
    assert "summarising esc\N{REPLACEMENT CHARACTER}[31m[red]RED.jsonl" in terminal.getvalue()


# -- on a terminal --------------------------------------------------------------------------


def test_show_on_a_terminal_starts_no_progress_bar(tmp_path, monkeypatch):
    from ng_otel.cli import _progress

    path = write_lines(tmp_path / "rows.jsonl", *(saved_row(f"r{index}") for index in range(50)))
    # The bar would show at once: show prints trees while it reads, and a live bar redraws
    # itself at each of them (28 s instead of 1 s on 50,000 rows).
    monkeypatch.setattr(_progress, "PROGRESS_AFTER", 0.0)
    shown = show_output(path, terminal=True)
    assert "reading rows.jsonl" not in shown and "0:00:00" not in shown
    assert "agent_run_error" in shown and "50 failure chain group(s) shown" in shown


def test_a_terminal_gets_the_pipes_text_with_styles(tmp_path):
    import re

    hostile = {"event_id": "h1", "boundary": "agent", "failure_kind": "agent_run_error"}
    path = write_lines(
        tmp_path / "rows.jsonl",
        saved_row("r1"),
        # An empty reason: its line is blank, and blank it stays on a terminal too.
        json.dumps({"_ng_failure_id": "h1", "_ng_failure_events": {"h1": {**hostile, "failure_reason": ""}}}),
        json.dumps(
            {"_ng_failure_id": "h1", "_ng_failure_events": {"h1": {**hostile, "failure_reason": "[/red]\x1b "}}}
        ),
    )
    terminal = show_output(path, terminal=True)
    assert "\x1b[1magent_run_error\x1b[0m" in terminal  # the kind in bold, as rich prints it
    assert re.sub(r"\x1b\[[0-9;]*m", "", terminal) == show_output(path)
