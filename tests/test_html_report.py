"""`ng-otel report`: one HTML page that a real headless Chromium opens with no network, every
chart drawn, nothing on the console; text from a file never becomes markup in it."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ng_otel.cli import main
from ng_otel.cli.report import CHART_IDS, charts_of, render_page
from ng_otel.otel import names
from ng_otel.runs.summary import Summary

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("_mixed_rows", ROOT / "bench" / "_mixed_rows.py")
mixed_rows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mixed_rows)

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium; .ci/run installs it)"
)


def chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # root in CI
            "--disable-gpu",
            f"--user-data-dir={profile}",
            "--host-resolver-rules=MAP * ~NOTFOUND",  # no network: any fetch would fail, loudly
            "--enable-logging=stderr",
            "--log-level=0",  # every console message, errors included, as INFO:CONSOLE lines
            "--virtual-time-budget=20000",
            "--window-size=1280,2600",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.e2e
@needs_chromium
def test_report_renders_in_headless_chromium_offline_with_every_chart_drawn(tmp_path, cli):
    rows = tmp_path / "rows.jsonl"
    mixed_rows.write_mixed_rows(rows, 2_000, bad_every=600)
    page = tmp_path / "report.html"
    done = cli("report", str(rows), "-o", str(page))
    assert done.returncode == 0, done.stdout + done.stderr
    text = page.read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text), "the page loads nothing from outside"
    expected = {"by-kind", "by-class", "root-kinds", "masked", "by-stage"}  # rows carry no time: no over-time
    assert {chart for chart in CHART_IDS if f'id="{chart}"' in text} == expected

    dom = chromium(page, tmp_path / "profile", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    drawn = set(re.findall(r'id="([a-z-]+)"[^>]*data-drawn="true"', dom.stdout))
    assert drawn == expected
    for chart in expected:  # drawn means plotted: an SVG with its traces inside the chart's div
        body = dom.stdout.split(f'id="{chart}"', 1)[1].split('class="chart', 1)[0]
        assert 'class="main-svg"' in body and ('class="trace' in body or 'class="slice' in body), chart
    assert "agent_run_error" in dom.stdout and "transport_timeout" in dom.stdout  # the chains as trees

    screenshot = tmp_path / "report.png"
    shot = chromium(page, tmp_path / "profile", f"--screenshot={screenshot}")
    assert shot.returncode == 0 and screenshot.stat().st_size > 20_000, shot.stderr[-2000:]


def test_text_from_a_file_never_becomes_markup_in_the_page():
    hostile = '<img src=x onerror="alert(1)"></script><a href="https://evil.example">'
    line = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "t1",
                                "events": [
                                    {
                                        "name": names.EVENT,
                                        "attributes": [
                                            {"key": names.ID, "value": {"stringValue": "e1"}},
                                            {"key": names.KIND, "value": {"stringValue": "transport_timeout"}},
                                            {"key": names.BOUNDARY, "value": {"stringValue": "model"}},
                                            # The one free text an event brings to the page (kinds
                                            # and boundaries are held to a row's names).
                                            {"key": names.STAGE, "value": {"stringValue": hostile}},
                                        ],
                                    }
                                ],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    summary = Summary()
    summary.files.append(hostile)
    summary.add_otlp(line, 1)
    page = render_page(summary.finish(), "/* plotly */")
    assert summary.events == 1 and summary.failed_rows == 1
    assert "<img" not in page and "<a href" not in page and page.count("</script>") == 3
    assert "&lt;img src=x" in page  # the file list, escaped as text
    (label,) = charts_of(summary)["by-stage"]["data"][0]["x"]
    assert "img src=x" in label and "<" not in label and ">" not in label  # plotly reads tags in labels


def failure_event_line(event_id: str, time: str) -> dict:
    """One OTLP JSON line: a span with one ``ng.failure`` event at ``time`` (unix ns, as text)."""
    attributes = [
        {"key": names.ID, "value": {"stringValue": event_id}},
        {"key": names.KIND, "value": {"stringValue": "transport_timeout"}},
        {"key": names.BOUNDARY, "value": {"stringValue": "model"}},
    ]
    event = {"name": names.EVENT, "timeUnixNano": time, "attributes": attributes}
    return {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "t1", "events": [event]}]}]}]}


MINUTE_NS = 60 * 10**9


@pytest.mark.parametrize(
    "time",
    [
        "253402300800000000000",  # year 10000
        "-99999999999999999999",  # before year 1
        str(2**70),
        "99999999999999999999999999",  # past what the C library's time functions take
    ],
)
def test_event_times_no_date_can_show_are_left_out_of_the_over_time_chart_only(time):
    summary = Summary()
    for number, (event_id, when) in enumerate(
        [("a", str(MINUTE_NS)), ("b", str(2 * MINUTE_NS)), ("c", time), ("d", time)], start=1
    ):
        summary.add_otlp(failure_event_line(event_id, when), number)
    charts = charts_of(summary.finish())
    over_time = charts["over-time"]["data"][0]
    assert over_time["x"] == ["1970-01-01T00:01:00+00:00", "1970-01-01T00:02:00+00:00"]
    assert over_time["y"] == [1, 1]
    assert charts["by-kind"]["data"][0]["y"] == [4]  # every event still counts everywhere else
    assert 'id="over-time"' in render_page(summary, "/* plotly */")


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"_ng_failure_class": "transport_timeout"}) + "\n")
    return path


def one_line_on_stderr(capsys) -> str:
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    return err


@pytest.mark.parametrize("where", ["a folder", "in a missing folder", "/proc/version"])
def test_an_output_that_cannot_be_written_is_named_as_the_output(rows_file, tmp_path, capsys, where):
    output = {
        "a folder": tmp_path,
        "in a missing folder": tmp_path / "missing" / "report.html",
        "/proc/version": Path("/proc/version"),  # opens (or is refused), then fails to write
    }[where]
    assert main(["report", str(rows_file), "-o", str(output)]) == 2
    assert one_line_on_stderr(capsys).startswith(f"ng-otel: cannot write {output}: ")


def test_report_refuses_to_write_over_one_of_its_inputs_under_any_name(rows_file, tmp_path, capsys, monkeypatch):
    before = rows_file.read_bytes()
    other = tmp_path / "other.jsonl"
    other.write_bytes(before)
    (tmp_path / "symlink.jsonl").symlink_to(rows_file)
    os.link(rows_file, tmp_path / "hardlink.jsonl")
    monkeypatch.chdir(tmp_path)
    for output in (
        "rows.jsonl",
        str(rows_file),
        "symlink.jsonl",
        "hardlink.jsonl",
        "../" + tmp_path.name + "/rows.jsonl",
    ):
        assert main(["report", str(other), str(rows_file), "-o", output]) == 2, output
        assert f"cannot write {output}: it is the input {rows_file}" in one_line_on_stderr(capsys)
    assert rows_file.read_bytes() == before
    assert main(["report", str(other), "-o", "report.html"]) == 0  # a new file beside them is fine


def test_without_plotly_report_says_how_to_install_it_on_stderr(rows_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ng_otel.cli.report.plotly_js", lambda: None)
    assert main(["report", str(rows_file), "-o", str(tmp_path / "report.html")]) == 2
    from ng_otel.cli._install import install_hint

    assert f"report needs plotly to draw its charts: {install_hint('report')}" in one_line_on_stderr(capsys)
    assert not (tmp_path / "report.html").exists()


def test_report_names_its_output_literally(rows_file, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "[red]esc\x1b[31m.html"  # markup rich would read, an escape sequence a terminal would obey
    assert main(["report", str(rows_file), "-o", name]) == 0
    shown = name.replace("\x1b", "\N{REPLACEMENT CHARACTER}")
    assert capsys.readouterr().out.startswith(f"report: {shown} (")
