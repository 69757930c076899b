"""`ng-otel summary` (and `show` on OTLP JSON lines) as a user runs them, on rows of both
formats written by a generator that knows every figure, and on OTLP JSON lines that real
exporters sent to a real OTLP receiver."""

import importlib.util
import io
import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from ng_otel.contract.report import FailureReport
from ng_otel.otel.recorder import FailureRecorder
from ng_otel.runs.inputs import SkippedLine, read_json_lines
from ng_otel.runs.summary import SUMMARY_KEYS

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("_mixed_rows", ROOT / "bench" / "_mixed_rows.py")
mixed_rows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mixed_rows)

HOSTILE = "[/red][link=https://evil.example]click[/link]"


def summary_json(cli, *paths):
    done = cli("summary", "--json", *map(str, paths))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


# -- the bounded line reader ---------------------------------------------------------------


def reference_lines(data: bytes, bound: int):
    """What read_json_lines must give, by the simplest reading: split, then decode each."""
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    out = []
    for number, part in enumerate(parts, start=1):
        if len(part) > bound:
            out.append((number, "skipped"))
            continue
        if not part.strip():
            continue
        try:
            out.append((number, orjson.loads(part)))
            continue
        except orjson.JSONDecodeError:
            pass
        if part.startswith(b"\xef\xbb\xbf") and not part[3:].strip():
            continue  # a byte order mark alone is a blank line
        try:  # what Python's json writes and reads (NaN, Infinity) and a byte order mark
            value = json.loads(part.decode("utf-8-sig"))
            json.dumps(value, ensure_ascii=False).encode()  # a lone surrogate is no text
            out.append((number, value))
        except ValueError:
            out.append((number, "skipped"))
    return out


PIECES = [
    *(b'{"a": 1}', b"", b"  ", b"[1, 2, 3, 4, 5, 6, 7]", b"nope", b"\xff\xfe", b'{"b": "' + b"x" * 30 + b'"}', b"7"),
    *(b'\xef\xbb\xbf{"bom": 1}', b'{"reward": -Infinity}', b'{"lone": "\\ud800"}', b"\xef\xbb\xbf", b"\xef\xbb\xbf "),
]


@given(st.lists(st.sampled_from(PIECES), max_size=12), st.booleans(), st.integers(min_value=1, max_value=48))
def test_bounded_reader_gives_each_line_as_a_plain_split_would_with_long_lines_skipped(pieces, newline, bound):
    data = b"\n".join(pieces) + (b"\n" if newline else b"")
    got = [
        (number, "skipped" if isinstance(value, SkippedLine) else value)
        for number, value in read_json_lines(io.BytesIO(data), max_line_bytes=bound)
    ]
    assert got == reference_lines(data, bound)


def test_a_byte_order_mark_is_no_text_and_never_the_reason_a_line_is_skipped():
    data = b'\xef\xbb\xbf\n\xef\xbb\xbf{"a": 1,}\n\xef\xbb\xbf{"a": 1}\n'
    lines = dict(read_json_lines(io.BytesIO(data)))
    assert 1 not in lines and lines[3] == {"a": 1}  # a mark alone is a blank line
    assert lines[2].reason.startswith("not JSON: trailing comma")  # the text's fault, not the mark's


def test_reader_says_why_a_line_is_not_a_row():
    data = b'{"ok": 1}\n\xff\xfe\nnot json\n' + b"[" * 100_000 + b"\n" + b"x" * 64 + b'\n{"cut": "of'
    lines = dict(read_json_lines(io.BytesIO(data), max_line_bytes=100_001))
    assert lines[1] == {"ok": 1}
    reasons = {number: value.reason for number, value in lines.items() if isinstance(value, SkippedLine)}
    assert reasons[2].startswith("invalid UTF-8")
    assert reasons[3].startswith("not JSON")
    assert reasons[4].startswith("not JSON")  # nested past any decoder's depth: no RecursionError
    assert reasons[6].startswith("truncated")
    assert 1 not in reasons
    short = {n: v.reason for n, v in read_json_lines(io.BytesIO(data), max_line_bytes=32) if isinstance(v, SkippedLine)}
    assert short[4] == short[5] == "longer than 32 bytes"


# -- rows of both formats ------------------------------------------------------------------


def generated(got: dict) -> dict:
    """The figures ``mixed_rows.write_mixed_rows`` computes, of a summary's JSON."""
    keys = ("rows", "failed_rows", "events", "by_kind", "by_boundary", "by_class", "root_kinds", "masked", "skipped")
    return {key: got[key] for key in keys}


@pytest.mark.e2e
def test_summary_json_gives_exactly_the_counts_the_generator_wrote(tmp_path, cli):
    path = tmp_path / "rows.jsonl"
    expected = mixed_rows.write_mixed_rows(path, 3_000, bad_every=700)
    assert expected["skipped"] == 4 and expected["events"] > expected["rows"]
    got = summary_json(cli, path)
    assert list(got) == list(SUMMARY_KEYS)
    assert generated(got) == expected
    assert got["by_server"] == {"(unnamed)": expected["events"]}  # no row here names its servers
    assert sum(root["count"] for root in got["root_causes"]) == expected["failed_rows"]
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(path.read_bytes())
    twice = summary_json(cli, path, copy)  # several files: one summary
    assert twice["rows"] == 2 * expected["rows"] and twice["by_kind"] == {
        k: 2 * v for k, v in expected["by_kind"].items()
    }


@pytest.mark.e2e
def test_summary_terminal_view_has_the_tables_and_each_skipped_line_number(tmp_path, cli):
    path = tmp_path / "rows.jsonl"
    mixed_rows.write_mixed_rows(path, 1_500, bad_every=700)
    done = cli("summary", str(path))
    assert done.returncode == 0, done.stderr
    for title in ("failures by kind and boundary", "INFRA vs DATA", "root causes, ranked", "failures by stage"):
        assert title in done.stdout
    assert "transport_timeout" in done.stdout and "swe:patch_failed" in done.stdout
    assert "1,500 rows" in done.stdout and "masked (" in done.stdout
    assert f"{path}:701: skipped: invalid UTF-8 at byte 13" in done.stdout  # after row 700
    assert f"{path}:1402: skipped: not JSON" in done.stdout


@pytest.mark.e2e
def test_summary_of_a_missing_file_is_one_line_on_stderr_and_exit_2(tmp_path, cli):
    done = cli("summary", str(tmp_path / "nope.jsonl"))
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.count("\n") == 1 and "no such file" in done.stderr


@pytest.mark.e2e
def test_hostile_lines_are_skipped_and_echoed_literally_by_show_summary_and_kinds(tmp_path, cli):
    path = tmp_path / "hostile.jsonl"
    bad_key = {"_ng_failure_events": {HOSTILE: {"event_id": "q"}}}
    good = {
        "_ng_failure_id": "e1",
        "_ng_failure_events": {
            "e1": {"event_id": "e1", "boundary": "model", "failure_kind": "browser_crashed", "failure_reason": HOSTILE}
        },
    }
    path.write_bytes(
        b"\n".join(
            [
                orjson.dumps(bad_key),
                b'{"output": "\xff\xfe"}',  # invalid UTF-8
                b"[" * 200_000,  # nested past any depth
                # A failure row all the same: its derived id is written without recursion.
                b'{"_ng_failure_class": "agent_run_error", "deep": ' + b"[" * 1000 + b"]" * 1000 + b"}",
                orjson.dumps(good),
                b"x" * (33 * 1024 * 1024),  # past the line bound: never read whole
                b'{"_ng_failure_class": "judge_failed", "mask_sample": true}',
            ]
        )
        + b"\n"
    )
    for args, code in ((["show"], 0), (["summary"], 0), (["kinds", "--check"], 1)):
        done = cli(*args, str(path))
        assert done.returncode == code, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, args
        if args != ["kinds", "--check"]:
            assert HOSTILE in done.stdout, args  # printed as text, never as markup
            assert "line 2: skipped: invalid UTF-8" in done.stdout or ":2: skipped: invalid UTF-8" in done.stdout
            assert "longer than 33554432 bytes" in done.stdout and "depth limit exceeded" in done.stdout
            assert "agent_run_error" in done.stdout, args  # the deep row's failure, in every view
    got = summary_json(cli, path)
    assert (got["rows"], got["skipped"], got["events"], got["masked"]) == (3, 4, 3, 1)
    assert got["by_kind"] == {"agent_run_error": 1, "browser_crashed": 1, "judge_failed": 1}


# -- OTLP JSON lines from real exporters ---------------------------------------------------


def otlp_lines(otlp, path):
    """A model failure recorded in one trace, and the agent failure it caused recorded later in
    another trace (linked, not exported again), plus a recovered retry in a third trace; sent
    by the real OTLP/HTTP exporter to the real receiver, written as OTLP JSON lines."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=otlp.http_endpoint + "/v1/traces"))
    )
    recorder = FailureRecorder(tracer_provider.get_tracer("test"), MeterProvider().get_meter("test"))
    model = {
        "event_id": "m" * 32,
        "boundary": "model",
        "failure_kind": "transport_timeout",
        "failure_reason": "slow",
        "http_status": 504,
    }
    agent = {
        "event_id": "a" * 32,
        "boundary": "agent",
        "failure_kind": "agent_run_error",
        "failure_reason": "gave up",
        "cause_id": model["event_id"],
    }
    retry = {"event_id": "r" * 32, "boundary": "model", "failure_kind": "transport_peer_drop", "failure_reason": "x"}
    for events, failure_id in (([model], model), ([model, agent], agent), ([retry], None)):
        span = recorder.tracer.start_span("request")
        report = FailureReport({e["event_id"]: e for e in events}, failure_id["event_id"] if failure_id else None)
        recorder.record(report, span, own=failure_id is not None)
        span.end()
    tracer_provider.shutdown()
    assert otlp.wait_for(lambda: len(otlp.failure_events()) == 3)
    otlp.write_jsonl(path)
    return model, agent


@pytest.mark.e2e
def test_summary_reads_otlp_json_lines_and_follows_a_cause_into_another_trace(tmp_path, otlp, cli):
    path = tmp_path / "telemetry.jsonl"
    otlp_lines(otlp, path)
    got = summary_json(cli, path)
    assert {key: got[key] for key in generated(got)} | {"traces": got["traces"]} == {
        "rows": 0,  # OTLP JSON lines hold traces, not rows
        "traces": 3,
        "failed_rows": 1,  # the agent's failure; the model's is its cause, the retry recovered
        "events": 3,
        "by_kind": {"transport_timeout": 1, "agent_run_error": 1, "transport_peer_drop": 1},
        "by_boundary": {"model": 2, "agent": 1},
        "by_class": {"infra": 2, "data": 1},
        "root_kinds": {"transport_timeout": 1},
        "masked": 0,
        "skipped": 0,
    }


@pytest.mark.e2e
def test_show_draws_a_chain_that_crosses_traces_as_one_tree(tmp_path, otlp, cli):
    path = tmp_path / "telemetry.jsonl"
    model, agent = otlp_lines(otlp, path)
    done = cli("show", str(path), "--full-ids")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("traces "))
    assert lines[title + 1].startswith("└── agent_run_error  agent") and lines[title + 1].endswith(agent["event_id"])
    assert lines[title + 3].startswith("    └── transport_timeout  model · 504")
    assert lines[title + 3].endswith(model["event_id"])
    assert "2 failure chain group(s) shown" in done.stdout  # the joined chain, the recovered retry


# -- the fast reading of canonical saved reports -------------------------------------------

_IDS = st.sampled_from(["e1", "e2", "e3", "bad id", "", "x" * 129, "e1\n"])
_UNHASHABLE = st.sampled_from([[1], {"a": 1}])  # a hostile row's value: a TypeError in a set lookup
_RECORDS = st.fixed_dictionaries(
    {
        "event_id": _IDS,
        "boundary": st.one_of(st.sampled_from(["model", "agent", "nowhere", 3]), _UNHASHABLE),
        "failure_kind": st.one_of(
            st.sampled_from(["transport_timeout", "swe:patch_failed", "made_up", "Bad", "x" * 200, None]), _UNHASHABLE
        ),
        "failure_reason": st.one_of(st.text(max_size=5), st.just("r" * 2001), st.integers()),
    },
    optional={
        "stage": st.one_of(st.sampled_from(["agent", "seed", "nope", None]), _UNHASHABLE),
        "http_status": st.sampled_from([504, 99, 600, True, "500", 200]),
        "cause_id": st.one_of(_IDS, _UNHASHABLE),
        "operation": st.sampled_from(["verify", "bad op"]),
        "foreign_error": st.one_of(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["SdkError", ""]), "message": st.text(max_size=3)},
                optional={"http_status": st.sampled_from([503, 700]), "extra": st.just(1)},
            ),
            st.just("not a dict"),
        ),
        "unknown": st.just(1),
    },
)


@given(
    st.lists(_RECORDS, max_size=3),
    st.one_of(st.sampled_from([None, "e1", "e2", "zz", 5]), _UNHASHABLE),
    st.sampled_from([False, True, "yes", None]),
)
def test_fast_reading_of_a_saved_report_agrees_with_row_report(records, failure_id, omitted):
    from ng_otel.contract.rows import read_row, row_report

    row = {"_ng_failure_events": {record["event_id"]: record for record in records}}
    if failure_id is not None:
        row["_ng_failure_id"] = failure_id
    if omitted is not None:
        row["_ng_failure_events_omitted"] = omitted
    try:
        expected = row_report(row)
    except ValueError:
        with pytest.raises(ValueError):
            read_row(row)
        return
    assert read_row(row) == expected


def test_rows_as_collection_writes_them_take_the_fast_reading():
    from ng_otel.contract.rows import _canonical_saved_report, row_report

    for make in (mixed_rows._model_timeout, mixed_rows._namespaced, mixed_rows._retry_recovered, mixed_rows._omitted):
        row = make(7)
        fast = _canonical_saved_report(row)
        assert fast is not None and fast == row_report(row)


# -- the progress bar -------------------------------------------------------------------------


def test_a_long_read_shows_a_progress_bar_on_a_terminal_and_nothing_on_a_pipe(tmp_path, monkeypatch):
    from rich.console import Console

    from ng_otel.cli import _progress
    from ng_otel.cli.summary import summarise_files as summarise

    path = tmp_path / "rows.jsonl"
    expected = mixed_rows.write_mixed_rows(path, 3_000)  # ~3 MiB: the bar moves on each MiB read
    monkeypatch.setattr(_progress, "PROGRESS_AFTER", 0.0)  # the time itself is under test: "over a second" is now
    terminal, pipe = io.StringIO(), io.StringIO()
    assert generated(summarise([path], Console(file=terminal, force_terminal=True, width=100)).to_json()) == expected
    assert generated(summarise([path], Console(file=pipe, force_terminal=False, width=100)).to_json()) == expected
    assert "summarising rows.jsonl" in terminal.getvalue() and "%" in terminal.getvalue()
    assert pipe.getvalue() == ""
    monkeypatch.setattr(_progress, "PROGRESS_AFTER", 3600.0)  # a read shorter than the wait: no bar
    quick = io.StringIO()
    summarise([path], Console(file=quick, force_terminal=True, width=100))
    assert quick.getvalue() == ""


def test_endless_distinct_kinds_fold_into_other_and_every_count_is_kept(tmp_path, monkeypatch):
    from ng_otel.runs import summary

    monkeypatch.setattr(summary, "MAX_DISTINCT", 10)  # each figure's bound, small enough to pass
    path = tmp_path / "rows.jsonl"
    with path.open("wb") as out:
        for index in range(60):
            top, root = f"{index:032x}", f"{index + 1000:032x}"
            events = {
                top: {"event_id": top, "boundary": "agent", "failure_kind": f"srv:top_{index}",
                      "failure_reason": "r", "cause_id": root},
                root: {"event_id": root, "boundary": "model", "failure_kind": f"srv:root_{index}",
                       "failure_reason": "r", "http_status": 500 + index % 3},
            }  # fmt: skip
            out.write(orjson.dumps({"_ng_failure_id": top, "_ng_failure_events": events}) + b"\n")
            out.write(orjson.dumps({"_ng_failure_class": f"srv:sidecar_{index}"}) + b"\n")
    got = summary.Summary()
    got.add_file(path)
    # What a file of endless distinct values holds in memory before finish() folds it: bounded.
    assert len(got._row_tallies) <= 10 and len(got._rooted) <= 10
    assert all(len(figure) <= 11 for figure in (got.by_kind, got.by_boundary, got.chains, got.root_kinds))
    figures = got.finish().to_json()
    assert (figures["rows"], figures["failed_rows"], figures["events"]) == (120, 120, 180)
    for name, whole in (("by_kind", 180), ("by_boundary", 180), ("by_class", 180), ("root_kinds", 120)):
        counts = figures[name]
        assert sum(counts.values()) == whole, name
        assert len(counts) <= 10 + 1, name  # ten named, the rest under _other
    assert figures["by_kind"]["_other"] > 0 and figures["root_kinds"]["_other"] > 0
    assert sum(count for _, count in got.chains.most_common()) == 120


# -- OTLP JSON lines of odd shapes ----------------------------------------------------------


def _failure_attributes(event_id, kind, cause=None, boundary="model"):
    values = {"ng.failure.id": event_id, "ng.failure.kind": kind, "ng.failure.boundary": boundary}
    if cause is not None:
        values["ng.failure.cause_id"] = cause
    return [{"key": key, "value": {"stringValue": value}} for key, value in values.items()]


def _otlp_span_line(trace_id, *events):
    span_events = [{"name": "ng.failure", "attributes": _failure_attributes(*event)} for event in events]
    span = {"traceId": trace_id, "spanId": "s" + trace_id, "events": span_events}
    return orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


def test_otlp_causes_that_loop_are_one_failed_row_a_loop_never_none(tmp_path):
    from ng_otel.runs.summary import summarise

    path = tmp_path / "loops.jsonl"
    lines = [
        _otlp_span_line("t1", ("e1", "agent_run_error", "e2"), ("e2", "transport_timeout", "e1")),
        _otlp_span_line("t2", ("e3", "judge_failed", "e3")),  # its own cause
        _otlp_span_line("t3", ("e4", "agent_run_error", "e5")),  # e5 is in another trace ...
        _otlp_span_line("t4", ("e5", "transport_timeout", "e6"), ("e6", "transport_peer_drop", "e5")),  # ... looping
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    got = summarise([path]).to_json()
    assert (got["traces"], got["events"], got["failed_rows"], got["skipped"]) == (4, 6, 3, 0)
    assert sum(got["root_kinds"].values()) == 3
    # The chain entering the loop from e4 is followed until it comes back round, and ends there.
    assert got["root_kinds"]["transport_peer_drop"] == 1


def test_log_records_outside_spans_count_their_traces_as_rows_in_summary_and_show(tmp_path):
    from ng_otel.runs.chains import groups_from_lines
    from ng_otel.runs.inputs import file_lines as scan_file
    from ng_otel.runs.summary import summarise

    logs = [
        {"eventName": "ng.failure", "traceId": trace_id, "attributes": _failure_attributes(f"e{index}", "judge_failed")}
        for index, trace_id in enumerate(["a" * 32, "b" * 32, "b" * 32, ""])
    ]
    path = tmp_path / "logs.jsonl"
    path.write_bytes(orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": logs}]}]}) + b"\n")
    got = summarise([path]).to_json()
    # Two traces, and one record outside any trace: three traces for four failures, none a cause.
    assert (got["rows"], got["traces"], got["events"], got["failed_rows"]) == (0, 3, 4, 4)
    # show draws the same rows: a tree a trace, and one for the record outside any trace
    titles = [group.title for group in groups_from_lines(scan_file(path))]
    assert titles == [f"trace {'a' * 32}", f"trace {'b' * 32}", "trace (none: event e3)"]


@pytest.mark.e2e
def test_the_demos_rows_and_its_telemetry_agree_on_what_was_masked(tmp_path, ng_otel_process, cli):
    # The demo saves rows as Gym does, the verify reply's mask_sample at the top of the row.
    done = ng_otel_process("demo", "--out", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = summary_json(cli, tmp_path / "demo" / "rows.jsonl")
    telemetry = summary_json(cli, tmp_path / "demo" / "telemetry.jsonl")
    assert rows["masked"] == telemetry["masked"] == 1


def test_a_file_named_twice_is_summarised_once(tmp_path):
    from ng_otel.runs.summary import summarise

    path = tmp_path / "rows.jsonl"
    expected = mixed_rows.write_mixed_rows(path, 40)
    (tmp_path / "link.jsonl").symlink_to(path)  # the same file under another name, as a glob may give
    assert generated(summarise([path, path, tmp_path / "link.jsonl"]).to_json()) == expected


def test_the_first_json_line_decides_the_format_and_a_line_of_the_other_is_skipped(tmp_path):
    from ng_otel.runs.inputs import OTLP_LINE_AMONG_ROWS, ROW_AMONG_OTLP_LINES
    from ng_otel.runs.summary import summarise

    otlp_line = _otlp_span_line("t1", ("e1", "transport_timeout"))
    row_line = orjson.dumps({"_ng_failure_class": "agent_run_error"})
    otlp_first = tmp_path / "otlp.jsonl"
    otlp_first.write_bytes(b"not json\n" + otlp_line + b"\n" + row_line + b"\n")
    got = summarise([otlp_first])
    assert (got.traces, got.events, got.skipped) == (1, 1, 2)  # a skipped first line decides nothing
    assert [line.reason for _, line in got.skipped_lines][1] == ROW_AMONG_OTLP_LINES
    rows_first = tmp_path / "rows.jsonl"
    rows_first.write_bytes(row_line + b"\n" + otlp_line + b"\n")
    got = summarise([rows_first])
    assert (got.rows, got.events, got.skipped) == (1, 1, 1)  # not counted as a healthy row
    assert got.skipped_lines[0][1].reason == OTLP_LINE_AMONG_ROWS


def test_an_otlp_event_with_a_kind_boundary_or_id_no_row_could_hold_is_skipped_by_summary_and_show(tmp_path):
    from ng_otel.runs.chains import groups_from_lines
    from ng_otel.runs.inputs import file_lines as scan_file
    from ng_otel.runs.otlp import INVALID_OTLP_EVENT
    from ng_otel.runs.summary import summarise

    path = tmp_path / "odd.jsonl"
    events = [
        ("e1", "transport_timeout"),
        ("e2", "Transport-Timeout"),  # no kind a row could hold
        ("e3", "", None),
        ("e4", "judge_failed", None, "[red]nowhere"),  # no boundary
        ("bad id", "judge_failed"),
    ]
    lines = [_otlp_span_line(f"t{i}", event) for i, event in enumerate(events)]
    lines.append(_otlp_span_line("t9", ("e9", "judge_failed"), ("e10", "Bad"), ("e11", "Worse")))  # one line, once
    path.write_bytes(b"\n".join(lines) + b"\n")
    got = summarise([path])
    assert (got.events, got.skipped) == (2, 5)
    assert {line.reason for _, line in got.skipped_lines} == {INVALID_OTLP_EVENT}
    shown = list(groups_from_lines(scan_file(path)))
    assert [item.reason for item in shown if isinstance(item, SkippedLine)] == [INVALID_OTLP_EVENT] * 5


def test_an_odd_first_line_decides_nothing_and_odd_times_and_trace_ids_are_none(tmp_path):
    from ng_otel.runs.chains import groups_from_lines
    from ng_otel.runs.inputs import UNDECIDED_NOT_AN_OBJECT
    from ng_otel.runs.inputs import file_lines as scan_file
    from ng_otel.runs.summary import summarise

    spans = [
        {"traceId": None, "events": [{"name": "ng.failure", "timeUnixNano": float("inf"),
                                       "attributes": _failure_attributes("e1", "transport_timeout")}]},
        {"traceId": None, "events": [{"name": "ng.failure", "timeUnixNano": 1e400,
                                       "attributes": _failure_attributes("e2", "judge_failed")}]},
    ]  # fmt: skip
    otlp_line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()  # Infinity, as json writes
    path = tmp_path / "odd.jsonl"
    path.write_bytes(b"[1, 2]\n" + otlp_line + b"\n")
    got = summarise([path])
    # The list decides nothing; two events outside any trace (no trace named "None"): two traces.
    assert (got.traces, got.events, got.failed_rows, got.skipped) == (2, 2, 2, 1)
    assert got.skipped_lines[0][1].reason == UNDECIDED_NOT_AN_OBJECT and not got.over_time
    titles = [item.title for item in groups_from_lines(scan_file(path)) if not isinstance(item, SkippedLine)]
    assert titles == ["trace (none: event e1)", "trace (none: event e2)"]


@pytest.mark.e2e
def test_commands_that_list_kinds_print_no_warning_for_each_unregistered_one(tmp_path, cli):
    path = tmp_path / "kinds.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"_ng_failure_class": f"made_up_{n}"}) + b"\n" for n in range(5)))
    for args in (["summary"], ["show"], ["kinds", "--check"]):
        done = cli(*args, str(path))
        assert "made_up_4" in done.stdout, args  # listed by the command itself ...
        assert "unregistered failure_kind" not in done.stderr, (args, done.stderr)  # ... not warned of again


def test_main_leaves_the_kind_warnings_as_it_found_them(tmp_path, caplog):
    import logging

    from ng_otel.cli import main
    from ng_otel.contract.kinds import validate_failure_kind

    path = tmp_path / "rows.jsonl"
    path.write_bytes(orjson.dumps({"_ng_failure_class": "made_up_kind"}) + b"\n")
    assert main(["summary", "--json", str(path)]) == 0
    with caplog.at_level(logging.WARNING, logger="ng_otel"):
        validate_failure_kind("another_made_up_kind")  # main() ran in this process: the library still warns
    assert "another_made_up_kind" in caplog.text


def test_a_gzip_compressed_file_is_named_as_such(tmp_path):
    import gzip

    from ng_otel.runs.summary import summarise

    path = tmp_path / "rows.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(orjson.dumps({"row": n}) + b"\n" for n in range(100))))
    got = summarise([path])
    assert got.rows == 0 and got.skipped_lines[0][1].reason.startswith("gzip-compressed: decompress the file first")
