"""``ng-otel demo``: the example Gym stack, every failure scenario, the chains it produced.

Telemetry goes to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set (a collector, Jaeger);
otherwise an embedded OTLP receiver writes it as OTLP JSON lines, the format of the
Collector's ``otlpjsonfile`` receiver, so nothing needs to be running first.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ng_otel.cli._install import install_hint
from ng_otel.otel import names

FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_METRIC_EXPORT_INTERVAL": "1000"}


def run_demo(out: Path, console: Console) -> int:
    """Run the example stack (shipped in ``ng_otel.cli.demo_stack``) from any folder; its
    rows, telemetry and logs go under ``out``."""
    try:
        import aiohttp  # noqa: F401
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor  # noqa: F401
    except ImportError as missing:
        needed = escape(missing.name or "its servers")
        # soft_wrap: the command stays one line to copy, however narrow the terminal
        console.print(f"[red]ng-otel demo needs {needed}: {escape(install_hint('demo'))}[/red]", soft_wrap=True)
        return 2
    from ng_otel.cli.demo_stack.stack import gym_stack, run_collection
    from ng_otel.cli.receiver import OtlpReceiver
    from ng_otel.cli.show import show_groups
    from ng_otel.runs.chains import groups_from_lines
    from ng_otel.runs.inputs import read_json_lines

    started = time.monotonic()
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows_path, telemetry_path = out / "rows.jsonl", out / "telemetry.jsonl"
    external = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    receiver = None if external else OtlpReceiver().start()
    env = dict(FAST_EXPORT)
    if receiver is not None:
        env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    where = external or f"the embedded receiver -> {telemetry_path}"
    try:
        with console.status("starting the model, resources and agent servers ...") as status:
            with gym_stack(env=env, log_dir=out) as urls:
                status.update(f"running the rollout scenarios through {urls.agent} ...")
                try:
                    run_collection(urls.agent, rows_path, env, timeout=120)
                except RuntimeError as error:
                    console.print(f"[red]{escape(str(error))}[/red]")
                    return 1
                status.update("stopping the servers (they flush their telemetry on the way out) ...")
            if receiver is not None:
                status.update("waiting for the last telemetry ...")
                expected = _event_ids(rows_path)
                receiver.wait_for(lambda: expected <= {e[names.ID] for e in receiver.failure_events()}, 15)
                lines = receiver.write_jsonl(telemetry_path)
    finally:
        if receiver is not None:
            receiver.stop()

    console.rule("failure chains, one tree per rollout (effect first, each child its cause)")
    with rows_path.open("rb") as stream:
        show_groups(groups_from_lines(read_json_lines(stream)), console)
    console.rule("saved rollout rows")
    console.print(_rows_table(rows_path))
    console.print(f"rows: {rows_path}    telemetry: {where}" + (f" ({lines} OTLP JSON lines)" if receiver else ""))
    console.print(f"server logs: {out}/*.log    took {time.monotonic() - started:.1f}s")
    console.print(
        f"next: ng-otel show {telemetry_path if receiver else rows_path}  ·  "
        f"ng-otel replay {rows_path}  ·  docs/quickstart.md"
    )
    return 0


def _event_ids(rows_path: Path) -> set[str]:
    ids: set[str] = set()
    for line in rows_path.read_text(encoding="utf-8").splitlines():
        ids |= set(json.loads(line).get("_ng_failure_events", {}))
    return ids


def _rows_table(rows_path: Path) -> Table:
    table = Table("scenario", "status", "trace id", "failure id", "events", "omitted")
    for line in rows_path.read_text(encoding="utf-8").splitlines():
        row: dict[str, Any] = json.loads(line)
        table.add_row(
            str(row.get("scenario")),
            str(row.get("status")),
            str(row.get("trace_id", ""))[:16] + "...",
            str(row.get("_ng_failure_id", "-"))[:12],
            str(len(row.get("_ng_failure_events", {}))),
            "yes" if row.get("_ng_failure_events_omitted") else "",
        )
    return table


def demo_command(args: Any, console: Console) -> int:
    return run_demo(args.out, console)
