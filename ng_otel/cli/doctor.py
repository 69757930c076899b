"""``ng-otel doctor``: what ng_otel would do in a server started with this environment.

Run it with the environment your servers get. It resolves ng_otel's settings (and where each
came from), who would own the providers, the exporters each signal would get and whether
their endpoints answer, the service name, and which frameworks the no-code path would patch.
Its exit status is non-zero when failures would be recorded nowhere: ng_otel off, no trace
and no metric exporter, or no endpoint answering.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ng_otel.otel.settings import PARAMS, Settings, SettingsError, redact

SIGNALS = ("traces", "metrics", "logs")
CONNECT_SECONDS = 1.0
_OTLP_PORTS = {"grpc": 4317, "http/protobuf": 4318}
NOWHERE = "no trace or metric exporter that would deliver: failures would be recorded nowhere"
FATAL = ("ng_otel is switched off", "OTEL_SDK_DISABLED", NOWHERE)


@dataclass
class Exporter:
    signal: str
    name: str
    target: str = ""  # the class the entry point loads
    endpoint: str = ""
    answers: bool | None = None  # None: no endpoint to try
    error: str = ""


@dataclass
class Diagnosis:
    settings: list[tuple[str, str, str]] = field(default_factory=list)  # variable, value, source
    settings_error: str = ""
    providers: str = ""
    service_name: str = ""
    exporters: list[Exporter] = field(default_factory=list)
    frameworks: list[tuple[str, str]] = field(default_factory=list)  # name, version or "not installed"
    instrumentor: bool = False
    problems: list[str] = field(default_factory=list)


def diagnose() -> Diagnosis:
    from ng_otel.gym.deployment import gym_process, gym_telemetry_installs_providers
    from ng_otel.integrations import FRAMEWORKS
    from ng_otel.otel.providers import _Resource, exporter_classes

    found = Diagnosis()
    try:
        settings = Settings.resolve()
    except SettingsError as error:
        found.settings_error = str(error)
        found.problems.append(f"ng_otel stays off: {error}")
        settings = None
    for param in PARAMS:
        value = getattr(settings, param.attribute) if settings else None
        shown = ",".join(sorted(value)) if isinstance(value, frozenset) else str(value)
        source = settings.sources[param.attribute] if settings else "-"
        found.settings.append((param.variable, shown, source))
    if settings is not None and not settings.enabled:
        found.problems.append("ng_otel is switched off (NG_OTEL_ENABLED)")
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        found.providers = "none: OTEL_SDK_DISABLED=true (failures go to the no-op API)"
        found.problems.append("OTEL_SDK_DISABLED=true: nothing is exported")
    else:
        # Where Gym's telemetry is on, it may install none (nemo-lens 0.1.0 cannot): then
        # ng_otel installs its own, so the exporters below are what gets used either way.
        found.providers = (
            "NeMo Gym's telemetry (nemo-lens), where it installs them when a server starts; "
            "otherwise ng_otel installs SDK providers"
            if gym_telemetry_installs_providers()
            else "ng_otel installs SDK providers, unless the application or opentelemetry-distro did first"
        )
        process = gym_process()
        resource = _Resource(None, process.service_name if process is not None else None)
        found.service_name = str(resource.make().attributes.get("service.name", ""))
        wants_logs = settings is not None and "logs" in settings.signals
        for signal_name in SIGNALS if wants_logs else SIGNALS[:2]:  # a logs pipeline only in logs mode
            found.exporters += _exporters(signal_name, exporter_classes)
        _judge_exporters(found, settings)
    for name in (name for framework in FRAMEWORKS for name in framework.distributions):
        try:
            found.frameworks.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            found.frameworks.append((name, "not installed"))
    found.instrumentor = any(
        ep.name == "ng_otel" for ep in importlib.metadata.entry_points(group="opentelemetry_instrumentor")
    )
    return found


def _exporters(signal_name: str, exporter_classes: Any) -> list[Exporter]:
    raw = os.environ.get(f"OTEL_{signal_name.upper()}_EXPORTER", "").strip() or "otlp"
    names = [name.strip() for name in raw.split(",") if name.strip()]
    if [name.lower() for name in names] == ["none"]:
        return [Exporter(signal_name, "none")]
    try:
        classes = exporter_classes(signal_name)
    except Exception as error:  # what enable() would reject: say why
        return [Exporter(signal_name, raw, error=f"{type(error).__name__}: {error}")]
    from ng_otel.otel.providers import grpc_credentials_problem, otlp_endpoint

    found = []
    for name, cls in zip([n for n in names if n.lower() != "none"], classes, strict=False):
        exporter = Exporter(signal_name, name, target=f"{cls.__module__}.{cls.__qualname__}")
        if "otlp" in cls.__module__:
            protocol = "grpc" if ".grpc." in cls.__module__ else "http/protobuf"
            exporter.endpoint = otlp_endpoint(signal_name)[1] or f"http://localhost:{_OTLP_PORTS[protocol]}"
            exporter.error = grpc_credentials_problem(signal_name, cls) or ""
            exporter.answers = None if exporter.error else _answers(exporter.endpoint)
        found.append(exporter)
    return found


def _answers(endpoint: str) -> bool:
    """Whether something accepts a TCP connection there (not whether it speaks OTLP)."""
    try:
        parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname or "localhost", port), timeout=CONNECT_SECONDS):
            return True
    except (OSError, ValueError):
        return False


def _judge_exporters(found: Diagnosis, settings: Settings | None) -> None:
    for exporter in found.exporters:
        if exporter.error:
            found.problems.append(redact(f"OTEL_{exporter.signal.upper()}_EXPORTER: {exporter.error}"))
        elif exporter.answers is False:
            found.problems.append(f"{exporter.signal}: nothing answers at {redact(exporter.endpoint)}")
    # Spans carry the events, metrics the counts: one of them must get somewhere.
    delivering = [
        e
        for e in found.exporters
        if e.signal in ("traces", "metrics") and e.name != "none" and not e.error and e.answers is not False
    ]
    if not delivering:
        found.problems.append(NOWHERE)
    elif not any(e.signal == "traces" for e in delivering) and (settings is None or "logs" not in settings.signals):
        found.problems.append(
            "no trace exporter delivers: only counts arrive; the ng.failure events and their cause links ride on "
            "spans (NG_OTEL_SIGNALS=spans,logs sends the events as log records too)"
        )
    if (
        settings is not None
        and "logs" in settings.signals
        and all(e.name == "none" for e in found.exporters if e.signal == "logs")
    ):
        found.problems.append("NG_OTEL_SIGNALS has logs but OTEL_LOGS_EXPORTER=none")


def run_doctor(console: Console) -> int:
    found = diagnose()
    settings = Table("setting", "value", "from", title="ng_otel settings")
    for variable, value, source in found.settings:
        settings.add_row(variable, escape(value), source)
    console.print(settings)
    console.print(f"providers: {escape(found.providers)}")
    if found.service_name:
        console.print(f"service.name: {escape(found.service_name)}")
    if found.exporters:
        exporters = Table("signal", "exporter", "class", "endpoint", "answers", title="exporters")
        for e in found.exporters:
            answers = "" if e.answers is None else "yes" if e.answers else "[red]no[/red]"
            shown = escape(redact(e.error)) if e.error else escape(e.target)
            exporters.add_row(e.signal, escape(e.name), shown, escape(redact(e.endpoint)), answers)
        console.print(exporters)
    frameworks = ", ".join(f"{name} {version}" for name, version in found.frameworks)
    console.print(f"frameworks: {escape(frameworks)}")
    console.print(
        "opentelemetry-instrument loads ng_otel: "
        + ("yes" if found.instrumentor else "[red]no (the ng_otel entry point is not installed)[/red]")
    )
    for problem in found.problems:
        console.print(f"[red]problem: {escape(problem)}[/red]")
    if found.settings_error or any(p.startswith(FATAL) for p in found.problems):
        console.print("[red]verdict: failures would be recorded nowhere[/red]")
        return 1
    console.print("verdict: " + ("ok, with the problems above" if found.problems else "ok"))
    return 0


def doctor_command(args: Any, console: Console) -> int:
    return run_doctor(console)
