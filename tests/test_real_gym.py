"""The real-Gym lane: NeMo Gym 0.7.0 as users run it, with ng_otel from a freshly built wheel.

Every server is a real Gym server class started the way ``gym env start`` starts it: its
``app.py`` run from a fresh temporary folder by the Gym venv's interpreter, with the global
config that Gym's own parser resolved in ``NEMO_GYM_CONFIG_DICT`` and the server's name in
``NEMO_GYM_CONFIG_PATH``, so ``run_webserver`` builds Gym's own middleware stack. ng_otel
comes only through ``opentelemetry-instrument`` (no ng_otel code in the servers but the
``NgFailureEvent`` one route raises), exporting OTLP over gRPC to a real receiver.

The issue's "Done when": under ``opentelemetry-instrument``, from a temporary folder, a real
Gym 0.7.0 resources server's judge failure and a raised ``NgFailureEvent`` each arrive once,
on the server span, counted, with the report on the reply, and healthy replies are
byte-for-byte unchanged; a real Gym 0.7.0 collection's failure rows show and replay.

Run just this lane with ``make real-gym``.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ng_otel.cli.receiver import OtlpReceiver, attributes
from ng_otel.contract import FailureReport
from ng_otel.contract.rows import row_report
from tests.conftest import unused_port, wait_until
from tests.gym_lane import GymVenv, _run

pytestmark = [pytest.mark.real_gym, pytest.mark.e2e]

HERE = Path(__file__).resolve().parent / "real_gym"
START_TIMEOUT = 120.0  # a Gym server imports a lot; two cores start several at once
REQUEST_TIMEOUT = 30.0
EXPORT_TIMEOUT = 20.0
COLLECT_TIMEOUT = 240.0
CLI_TIMEOUT = 120.0
SETTLE = 1.5  # after the first copy arrived: the window a live server's duplicate gets to show up in
SPAN_KIND_SERVER = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER

RAISED_KIND = "real_gym:lookup_failed"  # the kind resources_app.py raises
REPR_BODY = re.compile(
    r"\"NgFailureEvent\('real_gym:lookup_failed', boundary='resources_server', event_id='(?P<id>[0-9a-f]{32})'\)\""
)


# -- HTTP, as raw as the reply comes ---------------------------------------------------------


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]  # in order, names lower-cased
    body: bytes

    def header(self, name: str) -> str | None:
        values = [value for key, value in self.headers if key == name.lower()]
        assert len(values) <= 1, f"{name} sent {len(values)} times: {values}"
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


def call(url: str, method: str, path: str, payload: Any = None, headers: dict[str, str] | None = None) -> Reply:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=REQUEST_TIMEOUT)
    try:
        body = None if payload is None else json.dumps(payload).encode()
        sent = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, path, body=body, headers={**sent, **(headers or {})})
        response = connection.getresponse()
        return Reply(response.status, [(k.lower(), v) for k, v in response.getheaders()], response.read())
    finally:
        connection.close()


def traceparent() -> tuple[str, dict[str, str]]:
    """A fresh trace id and the header that makes the server's span join that trace."""
    trace_id = secrets.token_hex(16)
    return trace_id, {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}


def verify_request(task: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": task},
        "response": {
            "id": "resp_agent",
            "created_at": 0,
            "model": "canned",
            "object": "response",
            "output": [
                {
                    "id": "msg_agent",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "4", "annotations": []}],
                }
            ],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
        },
    }


# -- what the receiver got ---------------------------------------------------------------------


def spans_in_trace(otlp: OtlpReceiver, trace_id: str) -> list[dict[str, Any]]:
    """Every span of one trace, with its kind (the receiver's own view leaves kind out)."""
    found = []
    for request in list(otlp.traces):
        for resource in request.resource_spans:
            service = attributes(resource.resource.attributes).get("service.name")
            for scope in resource.scope_spans:
                for span in scope.spans:
                    if span.trace_id.hex() != trace_id:
                        continue
                    found.append(
                        {
                            "service": service,
                            "name": span.name,
                            "kind": span.kind,
                            "span_id": span.span_id.hex(),
                            "events": [{"name": e.name, "attributes": attributes(e.attributes)} for e in span.events],
                        }
                    )
    return found


def failure_events_in_trace(otlp: OtlpReceiver, trace_id: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(event attributes, span) for every ``ng.failure`` event of one trace."""
    return [
        (event["attributes"], span)
        for span in spans_in_trace(otlp, trace_id)
        for event in span["events"]
        if event["name"] == "ng.failure"
    ]


def metric_total(otlp: OtlpReceiver, name: str, service: str, **labels: Any) -> float:
    """The sum over the latest cumulative points of ``name`` from ``service`` whose attributes
    include ``labels`` (dotted names given with ``__`` for ``.``)."""
    wanted = {key.replace("__", "."): value for key, value in labels.items()}
    return sum(
        point["value"]
        for point in otlp.metric_points(name)
        if point["service"] == service and all(point["attributes"].get(k) == v for k, v in wanted.items())
    )


# -- real Gym servers -------------------------------------------------------------------------


@dataclass
class GymServer:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    folder: Path

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else ""


@dataclass
class GymStack:
    """Servers of one resolved Gym config, each started as Gym starts it."""

    gym: GymVenv
    root: Path
    otlp: OtlpReceiver
    env_base: dict[str, str]
    blocks: dict[str, Any]
    config_yaml: str = ""
    servers: list[GymServer] = field(default_factory=list)

    def resolve(self) -> GymStack:
        folder = self.root / "config"
        folder.mkdir(parents=True)
        resolved = subprocess.run(
            [str(self.gym.python), str(HERE / "gym_config.py")],
            input=json.dumps(self.blocks),
            capture_output=True,
            text=True,
            cwd=folder,
            env=self.env_base,
            timeout=START_TIMEOUT,
            check=False,
        )
        assert resolved.returncode == 0, f"Gym's config parser failed:\n{resolved.stderr[-4000:]}"
        self.config_yaml = resolved.stdout
        return self

    def config(self) -> dict[str, Any]:
        return yaml.safe_load(self.config_yaml)

    def url(self, name: str, config_yaml: str | None = None) -> str:
        config = yaml.safe_load(config_yaml or self.config_yaml)
        (server_type,) = config[name].values()
        (instance,) = server_type.values()
        assert instance["host"] == "127.0.0.1", instance
        return f"http://{instance['host']}:{instance['port']}"

    def with_port(self, name: str, port: int) -> str:
        """The same global config with server ``name`` on another port (a twin of it)."""
        config = self.config()
        (server_type,) = config[name].values()
        (instance,) = server_type.values()
        instance["port"] = port
        config["disallowed_ports"] = [*config.get("disallowed_ports", []), port]
        return yaml.safe_dump(config, sort_keys=False)

    def start(
        self,
        name: str,
        app: Path,
        *,
        ng_otel: bool = True,
        service: str | None = None,
        config_yaml: str | None = None,
    ) -> GymServer:
        """``opentelemetry-instrument python app.py`` in a fresh folder, Gym's env set."""
        config_yaml = config_yaml or self.config_yaml
        folder = self.root / f"{service or name}-{'on' if ng_otel else 'off'}"
        folder.mkdir()
        if app.parent == HERE:  # our own servers are copied in as app.py, as in a Gym server folder
            shutil.copy(app, folder / "app.py")
            app = folder / "app.py"
        env = {
            **self.env_base,
            "NEMO_GYM_CONFIG_DICT": config_yaml,
            "NEMO_GYM_CONFIG_PATH": name,
            "NG_OTEL_ENABLED": "1" if ng_otel else "0",
            "OTEL_SERVICE_NAME": service or name,
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.otlp.grpc_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_METRIC_EXPORT_INTERVAL": "300",
            "PYTHONUNBUFFERED": "1",
        }
        with open(folder / "server.log", "wb") as log:
            process = subprocess.Popen(
                [str(self.gym.bin("opentelemetry-instrument")), str(self.gym.python), str(app)],
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = GymServer(name, self.url(name, config_yaml), process, folder)
        self.servers.append(server)
        return server

    def wait_ready(self, *servers: GymServer) -> None:
        """Wait until every server answers /health, within START_TIMEOUT for them all."""
        deadline = time.monotonic() + START_TIMEOUT
        for server in servers:

            def healthy(server: GymServer = server) -> bool:
                if server.process.poll() is not None:
                    pytest.fail(f"{server.name} exited with {server.process.returncode}:\n{server.log()}")
                return call(server.url, "GET", "/health").status == 200

            wait_until(
                healthy,
                max(deadline - time.monotonic(), 0),
                lambda server=server: f"{server.name} to answer /health:\n{server.log()}",
                ignoring=(OSError,),
            )

    def stop(self, server: GymServer) -> None:
        if server.process.poll() is None:
            try:
                os.killpg(server.process.pid, signal.SIGINT)
                server.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.process.pid, signal.SIGKILL)
                server.process.wait(timeout=15)
            except ProcessLookupError:
                pass
        if server in self.servers:
            self.servers.remove(server)

    def stop_all(self) -> None:
        for server in list(reversed(self.servers)):
            self.stop(server)


@contextmanager
def gym_stack(gym_venv: GymVenv, root: Path, env_base: dict[str, str], blocks: dict[str, Any]) -> Iterator[GymStack]:
    receiver = OtlpReceiver().start()
    stack = GymStack(gym_venv, root, receiver, env_base, blocks)
    try:
        yield stack.resolve()
    finally:
        try:
            stack.stop_all()
        finally:
            receiver.stop()


JUDGE_MODEL = {"judge_model": {"responses_api_models": {"canned_model": {"entrypoint": "app.py"}}}}
JUDGED = {
    "judged": {
        "resources_servers": {
            "judged_resources": {
                "entrypoint": "app.py",
                "domain": "other",
                "judge_model_server": {"type": "responses_api_models", "name": "judge_model"},
            }
        }
    }
}


# -- a real resources server: judge failure, raised failure, healthy replies ----------------------


@dataclass
class JudgedServers:
    stack: GymStack
    on: GymServer  # under opentelemetry-instrument with NG_OTEL_ENABLED=1
    off: GymServer  # the same server, the same config but its port, NG_OTEL_ENABLED=0

    @property
    def otlp(self) -> OtlpReceiver:
        return self.stack.otlp


@pytest.fixture(scope="class")
def judged(gym_venv, gym_env_base, tmp_path_factory) -> Iterator[JudgedServers]:
    with gym_stack(gym_venv, tmp_path_factory.mktemp("gym"), gym_env_base, {**JUDGE_MODEL, **JUDGED}) as stack:
        model = stack.start("judge_model", HERE / "model_app.py")
        on = stack.start("judged", HERE / "resources_app.py")
        off = stack.start(
            "judged", HERE / "resources_app.py", ng_otel=False, config_yaml=stack.with_port("judged", unused_port())
        )
        stack.wait_ready(model, on, off)
        yield JudgedServers(stack, on, off)


class TestResourcesServer:
    def test_judge_failure_arrives_once_on_the_server_span_counted_and_reported(self, judged: JudgedServers):
        trace_id, trace_headers = traceparent()
        request = verify_request("judge-down: what is 2+2?")
        reply = call(judged.on.url, "POST", "/verify", request, trace_headers)
        plain = call(judged.off.url, "POST", "/verify", request)

        # Gym's judge_failsafe answered, exactly as it does without ng_otel.
        assert (reply.status, reply.header("content-type")) == (plain.status, plain.header("content-type"))
        assert reply.body == plain.body, "the masked verify body changed under ng_otel"
        body = reply.json()
        assert reply.status == 200
        assert body["mask_sample"] is True and body["reward"] == 0.0
        assert body["failure_kind"] == body["_ng_failure_class"] == "judge_failed"
        assert body["instance_config"]["mask_sample"] is True
        assert body["failure_reason"] == body["_ng_failure_judge_error"]
        assert body["_ng_failure_judge_error"].startswith("ClientResponseError: 503")

        # Reported on the reply.
        assert reply.header("x-ng-failure-report") is not None, (
            f"no X-NG-Failure-Report on judge_failsafe's masked 200; headers: {reply.headers}"
        )
        report = FailureReport.from_header(reply.header("x-ng-failure-report"))
        assert report.failure_id is not None
        own = report.events[report.failure_id]
        assert own["failure_kind"] == "judge_failed" and own["boundary"] == "resources_server"
        assert reply.header("x-ng-failure-context") is not None, "no X-NG-Failure-Context on the masked 200"
        contexts = json.loads(reply.header("x-ng-failure-context"))

        # Recorded once, on the server span.
        assert judged.otlp.wait_for(
            lambda: any(
                a.get("ng.failure.kind") == "judge_failed" for a, _ in failure_events_in_trace(judged.otlp, trace_id)
            ),
            EXPORT_TIMEOUT,
        ), f"no ng.failure event for the judge failure; spans: {spans_in_trace(judged.otlp, trace_id)}"
        time.sleep(SETTLE)  # on purpose: a duplicate has no event to wait for, only time to arrive in
        events = [
            (a, s)
            for a, s in failure_events_in_trace(judged.otlp, trace_id)
            if a.get("ng.failure.kind") == "judge_failed"
        ]
        assert len(events) == 1, f"the judge failure arrived {len(events)} times: {events}"
        ((event, span),) = events
        assert span["kind"] == SPAN_KIND_SERVER and span["service"] == "judged", span
        assert span["name"].startswith("POST /verify"), span["name"]
        assert event["ng.failure.boundary"] == "resources_server"
        assert event["ng.failure.id"] == report.failure_id
        assert contexts[report.failure_id] == f"{trace_id}-{span['span_id']}"

        # Counted once: as a failure and as a masked verify outcome.
        def counted() -> bool:
            return (
                metric_total(judged.otlp, "ng.failures", "judged", ng__failure__kind="judge_failed") == 1
                and metric_total(
                    judged.otlp,
                    "ng.verify.outcomes",
                    "judged",
                    ng__verify__masked=True,
                    ng__failure__kind="judge_failed",
                )
                == 1
            )

        assert judged.otlp.wait_for(counted, EXPORT_TIMEOUT), (
            f"ng.failures {judged.otlp.metric_points('ng.failures')}; "
            f"ng.verify.outcomes {judged.otlp.metric_points('ng.verify.outcomes')}"
        )

    def test_raised_failure_arrives_once_on_the_server_span_counted_and_reported(self, judged: JudgedServers):
        trace_id, trace_headers = traceparent()
        reply = call(judged.on.url, "POST", "/lookup_broken", {"city": "Oslo"}, trace_headers)
        plain = call(judged.off.url, "POST", "/lookup_broken", {"city": "Oslo"})

        # Gym's catch-all exception middleware answered: a JSON 500 with repr(e), as without ng_otel.
        assert (reply.status, reply.header("content-type")) == (plain.status, plain.header("content-type"))
        assert reply.status == 500 and reply.header("content-type") == "application/json"
        assert REPR_BODY.fullmatch(plain.body.decode()), plain.body
        raised = REPR_BODY.fullmatch(reply.body.decode())
        assert raised, f"the body is not the catch-all's repr(e): {reply.body!r}"

        assert reply.header("x-ng-failure-report") is not None, (
            f"no X-NG-Failure-Report on the catch-all's 500; headers: {reply.headers}"
        )
        report = FailureReport.from_header(reply.header("x-ng-failure-report"))
        assert report.failure_id == raised["id"], "the report is not about the failure the handler raised"
        own = report.events[report.failure_id]
        assert own["failure_kind"] == RAISED_KIND and own["boundary"] == "resources_server"
        assert own["http_status"] == 503  # the event's own status; the reply stays the catch-all's 500
        assert reply.header("x-ng-failure-context") is not None, "no X-NG-Failure-Context on the catch-all's 500"
        contexts = json.loads(reply.header("x-ng-failure-context"))

        assert judged.otlp.wait_for(
            lambda: any(
                a.get("ng.failure.kind") == RAISED_KIND for a, _ in failure_events_in_trace(judged.otlp, trace_id)
            ),
            EXPORT_TIMEOUT,
        ), f"no ng.failure event for the raised failure; spans: {spans_in_trace(judged.otlp, trace_id)}"
        time.sleep(SETTLE)  # on purpose: a duplicate has no event to wait for, only time to arrive in
        events = [
            (a, s) for a, s in failure_events_in_trace(judged.otlp, trace_id) if a.get("ng.failure.kind") == RAISED_KIND
        ]
        assert len(events) == 1, f"the raised failure arrived {len(events)} times: {events}"
        ((event, span),) = events
        assert span["kind"] == SPAN_KIND_SERVER and span["service"] == "judged", span
        assert span["name"].startswith("POST /lookup_broken"), span["name"]
        assert event["ng.failure.boundary"] == "resources_server"
        assert event["ng.failure.id"] == raised["id"]
        assert contexts[raised["id"]] == f"{trace_id}-{span['span_id']}"

        assert judged.otlp.wait_for(
            lambda: metric_total(judged.otlp, "ng.failures", "judged", ng__failure__kind=RAISED_KIND) == 1,
            EXPORT_TIMEOUT,
        ), f"ng.failures {judged.otlp.metric_points('ng.failures')}"

    @pytest.mark.parametrize(
        ("method", "path", "payload"),
        [
            ("GET", "/health", None),
            ("POST", "/lookup", {"city": "Oslo"}),
            ("POST", "/verify", verify_request("what is 2+2?")),
            ("POST", "/seed_session", {}),
            ("GET", "/reverify_mode", None),
        ],
        ids=["health", "lookup", "verify", "seed_session", "reverify_mode"],
    )
    def test_healthy_replies_are_byte_for_byte_unchanged(self, judged: JudgedServers, method, path, payload):
        reply = call(judged.on.url, method, path, payload)
        plain = call(judged.off.url, method, path, payload)
        assert reply.status == plain.status == 200, (reply, plain)
        assert comparable(reply.headers) == comparable(plain.headers)
        assert reply.body == plain.body


def comparable(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Headers with what differs between any two replies left out: the date, and the session
    cookie's value (a fresh signed session id per reply); its name and attributes stay."""
    kept = []
    for name, value in headers:
        if name == "date":
            continue
        if name == "set-cookie":
            cookie, _, attributes_ = value.partition(";")
            value = f"{cookie.partition('=')[0]}=<session>;{attributes_}"
        kept.append((name, value))
    return kept


# -- a real collection: Gym's sidecar and judge rows, shown and replayed --------------------------


def _installed_dir(gym_venv, package: str, env: dict[str, str]) -> Path:
    found = subprocess.run(
        [
            str(gym_venv.python),
            "-c",
            f"import importlib.util; print(importlib.util.find_spec({package!r}).submodule_search_locations[0])",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=60,
        check=True,
    )
    return Path(found.stdout.strip())


COLLECTION_BLOCKS = {
    "policy_model": {"responses_api_models": {"canned_model": {"entrypoint": "app.py"}}},
    "judged": {
        "resources_servers": {
            "judged_resources": {
                "entrypoint": "app.py",
                "domain": "other",
                "judge_model_server": {"type": "responses_api_models", "name": "policy_model"},
            }
        }
    },
    "judged_agent": {
        "responses_api_agents": {
            "simple_agent": {
                "entrypoint": "app.py",
                "resources_server": {"type": "resources_servers", "name": "judged"},
                "model_server": {"type": "responses_api_models", "name": "policy_model"},
            }
        }
    },
    "judged_environment": {
        "environment_servers": {
            "legacy_agent": {
                "entrypoint": "app.py",
                "agent_server": {"type": "responses_api_agents", "name": "judged_agent"},
            }
        }
    },
}
TASKS = [
    "what is 2+2?",  # a healthy rollout
    "judge-down: what is 3+3?",  # the judge fails: judge_failsafe's masked row
    "model-down: what is 4+4?",  # the policy model fails: the agent's /run fails
]


@dataclass
class Collected:
    stack: GymStack
    rows: Path
    sidecar: Path
    folder: Path

    def read(self, path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="class")
def collected(gym_venv, gym_env_base, tmp_path_factory) -> Iterator[Collected]:
    root = tmp_path_factory.mktemp("gym-collection")
    agents = _installed_dir(gym_venv, "responses_api_agents", gym_env_base)
    environments = _installed_dir(gym_venv, "environment_servers", gym_env_base)
    with gym_stack(gym_venv, root, gym_env_base, COLLECTION_BLOCKS) as stack:
        servers = [
            stack.start("policy_model", HERE / "model_app.py"),
            stack.start("judged", HERE / "resources_app.py"),
            stack.start("judged_agent", agents / "simple_agent" / "app.py"),
            stack.start("judged_environment", environments / "legacy_agent" / "app.py"),
        ]
        stack.wait_ready(*servers)
        folder = root / "collection"
        folder.mkdir()
        tasks = folder / "tasks.jsonl"
        tasks.write_text(
            "".join(
                json.dumps({"responses_create_params": {"input": task}, "agent_ref": {"name": "judged_agent"}}) + "\n"
                for task in TASKS
            )
        )
        rows = folder / "rollouts.jsonl"
        env = {**gym_env_base, "NEMO_GYM_CONFIG_DICT": stack.config_yaml, "PYTHONUNBUFFERED": "1"}
        run = subprocess.run(
            [str(gym_venv.python), str(HERE / "collect.py"), str(tasks), str(rows), "judged_agent"],
            capture_output=True,
            text=True,
            cwd=folder,
            env=env,
            timeout=COLLECT_TIMEOUT,
            check=False,
        )
        (folder / "collect.log").write_text(run.stdout + run.stderr)
        assert run.returncode == 0, f"Gym's rollout collection failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
        yield Collected(stack, rows, rows.with_name("rollouts_failures.jsonl"), folder)


def ng_otel_cli(gym_venv, env_base: dict[str, str], folder: Path, *args: str, **env: str) -> str:
    """The ``ng-otel`` command the Gym venv's installed wheel provides, run from ``folder``."""
    done = subprocess.run(
        [str(gym_venv.bin("ng-otel")), *args],
        capture_output=True,
        text=True,
        cwd=folder,
        env={**env_base, "COLUMNS": "200", **env},
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"ng-otel {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


FAILURE_BOUNDARIES = {"model", "harness", "agent", "resources_server", "environment", "collection"}


class TestCollection:
    """Gym 0.7.0's collection writes every row with ``_ng_failure_class`` to the sidecar, the
    judge_failsafe rows included (``rollout_collection._run_from_config``: "Non-kill_shaped
    failure -> sidecar"); the main rows hold only the rollouts that were scored."""

    def test_gym_wrote_one_judge_row_and_one_run_failure_to_the_sidecar(self, collected: Collected):
        rows = collected.read(collected.rows)
        assert [row["responses_create_params"]["input"] for row in rows] == [TASKS[0]], rows
        assert all("_ng_failure_class" not in row for row in rows), rows
        assert collected.sidecar.exists(), f"no sidecar; the folder has {sorted(os.listdir(collected.folder))}"
        sidecar = {row["_ng_task_index"]: row for row in collected.read(collected.sidecar)}
        assert sorted(sidecar) == [1, 2], sidecar
        judge = sidecar[1]
        assert judge["_ng_failure_class"] == judge["failure_kind"] == "judge_failed"
        assert judge["mask_sample"] is True and judge["instance_config"]["mask_sample"] is True
        assert judge["_ng_failure_judge_error"].startswith("ClientResponseError: 503")
        run = sidecar[2]
        assert run["_ng_failure_class"] == "agent_run_error", run  # the agent answered 500: the rollout ran
        assert run["_ng_failure_type"] == "ClientResponseError" and run["_ng_failure_http_status"] == 500
        assert "policy model failed" in run["_ng_failure_response_body"]

    @pytest.mark.parametrize("which", ["sidecar", "rows"])
    def test_show_finds_one_failure_per_sidecar_and_judge_row(
        self, collected: Collected, gym_venv, gym_env_base, tmp_path, which
    ):
        path = collected.sidecar if which == "sidecar" else collected.rows
        failing = [row for row in collected.read(path) if row.get("_ng_failure_class")]
        out = ng_otel_cli(gym_venv, gym_env_base, tmp_path, "show", str(path))
        assert f"{len(failing)} failure chain group(s) shown" in out, out
        for row in failing:
            assert row["_ng_failure_class"] in out, out

    @pytest.mark.parametrize("which", ["sidecar", "rows"])
    def test_replay_exports_one_failure_per_sidecar_and_judge_row(
        self, collected: Collected, gym_venv, gym_env_base, tmp_path, which
    ):
        path = collected.sidecar if which == "sidecar" else collected.rows
        rows = collected.read(path)
        failing = [row for row in rows if row.get("_ng_failure_class")]
        receiver = OtlpReceiver().start()
        try:
            out = ng_otel_cli(
                gym_venv,
                gym_env_base,
                tmp_path,
                "replay",
                str(path),
                NG_OTEL_ENABLED="1",
                OTEL_SERVICE_NAME="replay",
                OTEL_EXPORTER_OTLP_ENDPOINT=receiver.grpc_endpoint,
                OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                OTEL_METRICS_EXPORTER="none",
                OTEL_LOGS_EXPORTER="none",
            )
            # Each row is the chain its nested error body names (collection's event, then one per
            # server), read as show and summary read it.
            records = [record for row in failing for record in row_report(row).events.values()]  # type: ignore[union-attr]
            summary = (
                f"replayed {len(rows)} rows: {len(failing)} with failures, {len(records)} events exported, "
                "0 failed to export, 0 skipped"
            )
            assert summary in out, out
            # The replay has exited, so every export it made has been answered, and stored first.
            assert receiver.wait_for(lambda: len(receiver.failure_events()) >= len(records), EXPORT_TIMEOUT)
            events = receiver.failure_events()
            assert sorted(e["ng.failure.kind"] for e in events) == sorted(r["failure_kind"] for r in records)
            tops = {row_report(row).failure_id for row in failing}  # type: ignore[union-attr]
            for event in events:
                assert event["ng.failure.boundary"] in FAILURE_BOUNDARIES, event
                if event["ng.failure.id"] in tops and event["ng.failure.kind"] != "judge_failed":
                    assert event["ng.failure.boundary"] == "collection", event  # the row's own: collection saw it
        finally:
            receiver.stop()


# -- `gym env start` and `gym eval run`, as Gym's docs start them ----------------------------------

LANE = HERE / "gym_env_lane.sh"
LANE_TIMEOUT = 9 * 60
EXPORT_INTERVAL = 1.0  # OTEL_METRIC_EXPORT_INTERVAL in the lane, in seconds
GYM_SERVERS = {
    "policy_model": "model",
    "genrm_model": "model",
    "simpleqa": "resources_server",
    "simpleqa_simple_agent": "agent",
    "simpleqa_environment_server": "environment",
}


def _value(value: dict[str, Any]) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    return int(value["intValue"]) if "intValue" in value else value


def _attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {item["key"]: _value(item["value"]) for item in items or ()}


@dataclass
class Received:
    """What ``ng-otel receive`` wrote (OTLP JSON lines, ids in hex): spans and metric points."""

    spans: list[dict[str, Any]] = field(default_factory=list)
    points: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> Received:
        received = cls()
        for line in path.read_text().splitlines():
            try:
                request = json.loads(line)
            except ValueError:
                continue  # the copy taken mid-run may end inside a line
            for resource in request.get("resourceSpans", ()):
                service = _attributes(resource["resource"].get("attributes")).get("service.name")
                for scope in resource.get("scopeSpans", ()):
                    for span in scope.get("spans", ()):
                        received.spans.append(
                            {
                                "service": service,
                                "name": span["name"],
                                "trace_id": span["traceId"],
                                "span_id": span["spanId"],
                                "parent": span.get("parentSpanId", ""),
                                "attributes": _attributes(span.get("attributes")),
                                "events": [
                                    _attributes(e.get("attributes"))
                                    for e in span.get("events", ())
                                    if e["name"] == "ng.failure"
                                ],
                                "links": [(link["traceId"], link["spanId"]) for link in span.get("links", ())],
                            }
                        )
            for resource in request.get("resourceMetrics", ()):
                service = _attributes(resource["resource"].get("attributes")).get("service.name")
                for scope in resource.get("scopeMetrics", ()):
                    for metric in scope.get("metrics", ()):
                        for point in metric.get("sum", {}).get("dataPoints", ()):
                            received.points.append(
                                {
                                    "service": service,
                                    "name": metric["name"],
                                    "time": int(point["timeUnixNano"]) / 1e9,
                                    "value": int(point.get("asInt", point.get("asDouble", 0))),
                                    "attributes": _attributes(point.get("attributes")),
                                }
                            )
        return received

    def events(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(event attributes, span) for every ``ng.failure`` event."""
        return [(event, span) for span in self.spans for event in span["events"]]

    def by_id(self) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        return {event["ng.failure.id"]: (event, span) for event, span in self.events()}

    def count(self, name: str, service: str, **labels: Any) -> int:
        """The latest cumulative value of ``name`` from ``service`` summed over the series whose
        attributes include ``labels`` (dotted names written with ``__``)."""
        wanted = {key.replace("__", "."): value for key, value in labels.items()}
        latest: dict[tuple[Any, ...], dict[str, Any]] = {}
        for point in self.points:
            if point["name"] == name and point["service"] == service:
                if all(point["attributes"].get(k) == v for k, v in wanted.items()):
                    key = tuple(sorted(point["attributes"].items()))
                    if key not in latest or point["time"] >= latest[key]["time"]:
                        latest[key] = point
        return sum(point["value"] for point in latest.values())


@dataclass
class Deployment:
    out: Path
    live: Received
    during: Received
    during_time: float
    fake_requests: list[dict[str, Any]]

    def rows(self, name: str) -> list[dict[str, Any]]:
        path = self.out / "run" / name
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def task_rows(self, name: str) -> dict[str, dict[str, Any]]:
        """The rows of ``name`` by their task's id (a failed /run's row holds only its index)."""
        tasks = [json.loads(line)["id"] for line in (HERE / "tasks.jsonl").read_text().splitlines()]
        return {tasks[row["_ng_task_index"]]: row for row in self.rows(name)}

    def fake_traces(self, cue: str | None) -> set[str]:
        """The traces of the policy requests that carried ``cue``."""
        return {
            r["traceparent"].split("-")[1]
            for r in self.fake_requests
            if r["cue"] == cue and r["path"] == "/v1/responses"
        }

    def fake_trace(self, cue: str) -> str:
        (trace_id,) = self.fake_traces(cue)  # the attempts of one rollout's policy call share its trace
        return trace_id


@pytest.fixture(scope="module")
def deployment(gym_venv, gym_env_base, tmp_path_factory) -> Deployment:
    """One run of ``tests/real_gym/gym_env_lane.sh`` in a private network namespace."""
    out = tmp_path_factory.mktemp("gym-env-start")
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.fail("the lane runs Gym in a private network namespace: it needs unshare(1) and root (CI is root)")
    env = {**gym_env_base, "GYM_VENV": str(gym_venv.path), "OUT": str(out), "LANE_TIMEOUT": str(LANE_TIMEOUT - 30)}
    done = _run(["bash", str(LANE)], LANE_TIMEOUT, env=env, cwd=out)
    lane_log = (out / "lane.log").read_text() if (out / "lane.log").exists() else ""
    assert done.returncode == 0 and "done" in lane_log, (
        f"the lane failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{lane_log}"
    )
    return Deployment(
        out,
        Received.read(out / "otlp.jsonl"),
        Received.read(out / "during.jsonl"),
        float((out / "during.time").read_text()),
        [json.loads(line) for line in (out / "fake_requests.jsonl").read_text().splitlines()],
    )


class TestGymEnvStart:
    """Stock Gym 0.7.0 servers started by ``gym env start`` under ``opentelemetry-instrument``,
    rollouts by ``gym eval run``: failures arrive as linked chains, with nothing changed in Gym."""

    def test_a_policy_model_answering_500_is_one_linked_chain_model_agent_collection_in_one_trace(
        self, deployment: Deployment
    ):
        events = deployment.live.by_id()
        row = deployment.task_rows("rollouts_failures.jsonl")["policy_500"]
        chain, current = [], row["_ng_failure_id"]  # collection saved the id the live run exported
        while current is not None:
            event, span = events[current]
            chain.append((event, span))
            current = event.get("ng.failure.cause_id")
        assert [(e["ng.failure.boundary"], e["ng.failure.kind"]) for e, _ in chain] == [
            ("collection", "agent_run_error"),
            ("agent", "agent_run_error"),  # simple_agent's /run, which called its own /v1/responses
            ("agent", "agent_run_error"),
            ("model", "provider_unavailable"),
        ]
        assert "backend overloaded" in chain[-1][0]["ng.failure.reason"]  # the provider's own words at the root
        assert [s["service"] for _, s in chain] == [
            "gym-eval-run",
            "simpleqa_simple_agent",
            "simpleqa_simple_agent",
            "policy_model",
        ]
        assert {s["trace_id"] for _, s in chain} == {deployment.fake_trace("FAIL500")}  # one trace
        for (effect, effect_span), (cause, cause_span) in itertools.pairwise(chain):
            assert (cause_span["trace_id"], cause_span["span_id"]) in effect_span["links"], (effect, cause)
        for _, span in chain[1:]:  # each on its own server's span, the one FastAPI's instrumentation made
            assert span["name"].startswith("POST /"), span
        for event, span in chain:
            assert deployment.live.count(
                "ng.failures",
                span["service"],
                ng__failure__boundary=event["ng.failure.boundary"],
                ng__failure__kind=event["ng.failure.kind"],
                ng__failure__recovered=False,
            ) == (2 if span["service"] == "simpleqa_simple_agent" else 1)

    def test_every_event_is_exported_once_and_nothing_comes_from_ray_s_processes(self, deployment: Deployment):
        ids = [event["ng.failure.id"] for event, _ in deployment.live.events()]
        assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
        services = {span["service"] for span in deployment.live.spans} | {p["service"] for p in deployment.live.points}
        assert set(GYM_SERVERS) | {"gym-env-start", "gym-eval-run"} <= services, services
        assert not [s for s in services if s is None or s.startswith("unknown_service")], services

    def test_every_request_gym_makes_carries_the_rollout_s_trace(self, deployment: Deployment):
        policy = [r for r in deployment.fake_requests if r["path"] == "/v1/responses"]
        assert policy and all(r["traceparent"] for r in policy)
        healthy = deployment.fake_traces(None)  # the healthy rollout's, and the one whose judge failed
        assert len(healthy) == 2, healthy
        for trace_id in healthy:
            services = {span["service"] for span in deployment.live.spans if span["trace_id"] == trace_id}
            assert set(GYM_SERVERS) | {"gym-eval-run"} <= services, services  # collection to judge, one trace

    def test_a_connection_dropping_model_is_counted_within_an_export_interval_while_gym_retries(
        self, deployment: Deployment
    ):
        dropped = [r for r in deployment.fake_requests if r["cue"] == "DROP"]
        assert [r for r in dropped if r["t"] > deployment.during_time], "Gym had stopped retrying"
        trace_id = deployment.fake_trace("DROP")
        attempts = [
            (event, span)
            for event, span in deployment.during.events()
            if span["trace_id"] == trace_id and event["ng.failure.kind"] == "transport_peer_drop"
        ]
        assert len(attempts) >= 3, attempts  # exported while the rollout hung, not when it ended
        assert {(e["ng.failure.boundary"], e["ng.failure.recovered"], s["service"]) for e, s in attempts} == {
            ("model", True, "policy_model")
        }
        counts = sorted(e["http.request.resend_count"] for e, _ in attempts)
        assert counts == list(range(len(counts)))
        first = min(r["t"] for r in deployment.fake_requests if r["done"] == "dropped" and r["path"] == "/v1/responses")
        counted = [
            p
            for p in deployment.during.points
            if p["name"] == "ng.failures"
            and p["service"] == "policy_model"
            and p["attributes"].get("ng.failure.kind") == "transport_peer_drop"
            and p["attributes"].get("ng.failure.recovered") is True
            and p["value"] >= 1
        ]
        assert counted and min(p["time"] for p in counted) <= first + 2 * EXPORT_INTERVAL + 1.0, (first, counted[:3])

    def test_a_model_that_drops_twice_then_answers_is_scored_with_its_two_recovered_attempts(
        self, deployment: Deployment
    ):
        row = deployment.task_rows("rollouts.jsonl")["policy_drops_twice"]
        assert row["reward"] == 1.0
        trace_id = deployment.fake_trace("DROPTWICE")
        attempts = [
            (e["http.request.resend_count"], s["service"])
            for e, s in deployment.live.events()
            if s["trace_id"] == trace_id and e["ng.failure.kind"] == "transport_peer_drop"
        ]
        # The policy's two dropped attempts, and the judge's (its prompt holds the question too).
        assert sorted(attempts) == [(0, "genrm_model"), (0, "policy_model"), (1, "genrm_model"), (1, "policy_model")]

    def test_a_judge_answering_503_is_masked_counted_once_and_caused_by_the_judge_model(self, deployment: Deployment):
        row = deployment.task_rows("rollouts_failures.jsonl")["judge_503"]
        assert row["mask_sample"] is True and row["_ng_failure_class"] == "judge_failed"
        judged = [(e, s) for e, s in deployment.live.events() if e["ng.failure.kind"] == "judge_failed"]
        assert [(e["ng.failure.boundary"], s["service"], e.get("ng.verify.masked")) for e, s in judged] == [
            ("resources_server", "simpleqa", True)
        ]
        (event, span), events = judged[0], deployment.live.by_id()
        cause, cause_span = events[event["ng.failure.cause_id"]]  # judge_failsafe answered: no raise says it
        assert (cause["ng.failure.kind"], cause_span["service"]) == ("provider_unavailable", "genrm_model")
        assert "backend overloaded" in cause["ng.failure.reason"]
        assert (cause_span["trace_id"], cause_span["span_id"]) in span["links"]
        assert row["_ng_failure_id"] == event["ng.failure.id"]  # saved under its live id, as the row's own
        assert deployment.live.count("ng.verify.outcomes", "simpleqa", ng__verify__masked=True) == 1

    def test_replay_into_the_backend_that_saw_the_run_adds_nothing_twice(self, deployment: Deployment):
        for log in ("replay_failures.log", "replay_rows.log"):
            text = " ".join((deployment.out / log).read_text().split())
            assert "0 events exported" in text and "exported by the live run" in text and text.endswith("exit 0"), text
        ids = [event["ng.failure.id"] for event, _ in deployment.live.events()]
        assert len(ids) == len(set(ids))


# -- after the run: the lane's rows read back as chains and as a coverage account -----------------

SAVED_REPORT_KEYS = ("_ng_failure_id", "_ng_failure_events", "_ng_failure_events_omitted", "_ng_failure_contexts")


class TestTheLaneSRowsAfterTheRun:
    """The files the lane's ``gym eval run`` wrote, read after the run with no telemetry: the
    sidecar row's nested body names the servers the live run's chain crossed, and the coverage
    account of the three files names the rollout that never finished."""

    def test_a_policy_model_answering_500_reads_as_model_agent_collection_with_the_provider_s_reason_at_the_root(
        self, deployment: Deployment
    ):
        from ng_otel.contract.inner_errors import parse_inner_error, row_chain_records, row_server_boundaries

        row = deployment.task_rows("rollouts_failures.jsonl")["policy_500"]
        chain = parse_inner_error(row["_ng_failure_response_body"], server_boundaries=row_server_boundaries(row))
        assert [(hop.class_name, hop.server, hop.boundary) for hop in chain.hops] == [
            ("SimpleAgent", "simpleqa_simple_agent", "agent"),  # /run, which called its own /v1/responses
            ("SimpleAgent", "simpleqa_simple_agent", "agent"),
            ("SimpleModelServer", "policy_model", "model"),
        ]
        assert chain.reason == "backend overloaded"  # the fake provider's own error.message

        # Read as a stock 0.7.0 row (without the report ng_otel saved beside it), the row is the
        # chain the live run exported: kind for kind, boundary for boundary, server for server.
        stock = {key: value for key, value in row.items() if key not in SAVED_REPORT_KEYS}
        outer = row_report(stock)
        assert outer is not None and outer.failure_id is not None
        own = {key: value for key, value in outer.events[outer.failure_id].items() if key != "cause_id"}
        records, servers = row_chain_records(stock, own)  # collection's own record, then the body's chain
        live, current = [], row["_ng_failure_id"]
        while current is not None:
            event, span = deployment.live.by_id()[current]
            live.append((event["ng.failure.boundary"], event["ng.failure.kind"], span["service"]))
            current = event.get("ng.failure.cause_id")
        assert [(r["boundary"], r["failure_kind"], s) for r, s in zip(records, servers, strict=True)] == [
            (boundary, kind, None if boundary == "collection" else service) for boundary, kind, service in live
        ]
        assert records[-1]["failure_reason"] == "backend overloaded"
        report = FailureReport(events={r["event_id"]: r for r in records}, failure_id=records[0]["event_id"])
        assert [r["event_id"] for r in report.chain()] == [r["event_id"] for r in records]

    def test_the_coverage_account_adds_up_to_the_materialized_inputs_and_its_unknown_is_the_hung_rollout(
        self, deployment: Deployment
    ):
        from ng_otel.runs.coverage import CoverageAccount, PromptGroup, read_run_coverage, run_files

        files = run_files(deployment.out / "run" / "rollouts.jsonl")
        assert files.failures is not None and files.inputs is not None  # beside the rows, by Gym's naming
        tasks = [json.loads(line)["id"] for line in (HERE / "tasks.jsonl").read_text().splitlines()]
        coverage = read_run_coverage(files)
        # healthy and policy_drops_twice scored; policy_500 and judge_503 (masked, but routed to
        # the sidecar) failed; policy_drops still retrying when collection was stopped.
        account = CoverageAccount(expected=5, measured=2, masked=0, failed=2, omitted=0, unknown=1)
        assert coverage.total == account
        assert coverage.by_agent == {"simpleqa_simple_agent": account}
        assert coverage.unknown_rollouts == ((tasks.index("policy_drops"), 0),)
        assert (coverage.outside_inputs, coverage.rows_without_rollout) == (0, 0)
        unscored = sorted(("policy_500", "judge_503", "policy_drops"), key=tasks.index)
        invalid = read_run_coverage(files, min_valid=1).groups_below_min_valid
        assert invalid == tuple(PromptGroup(tasks.index(task), valid=0, size=1) for task in unscored)

    def test_summary_and_report_say_which_server_failed_why_and_which_rollout_never_finished(
        self, deployment: Deployment, gym_venv, gym_env_base, tmp_path
    ):
        from ng_otel.cli.report import render_page
        from ng_otel.runs.summary import summarise

        rows = deployment.out / "run" / "rollouts.jsonl"
        tasks = [json.loads(line)["id"] for line in (HERE / "tasks.jsonl").read_text().splitlines()]
        # The command a user runs on the main rows alone: the sidecar and the inputs are found beside.
        got = json.loads(ng_otel_cli(gym_venv, gym_env_base, tmp_path, "summary", "--json", str(rows)))
        assert got["coverage"] == {"expected": 5, "measured": 2, "masked": 0, "failed": 2, "omitted": 0, "unknown": 1}
        never = [(item["task_index"], item["rollout_index"]) for item in got["unknown_rollouts"]]
        assert never == [(tasks.index("policy_drops"), 0)]
        # Where, and why: the rows saved the live report, whose root's reason quotes the provider.
        roots = [root for root in got["root_causes"] if root["server"] == "policy_model"]
        assert [root["failure_kind"] for root in roots] == ["provider_unavailable"]
        assert "backend overloaded" in roots[0]["reason"]
        assert got["by_server"]["policy_model"] >= 1 and got["by_server"]["simpleqa_simple_agent"] >= 2
        terminal = ng_otel_cli(gym_venv, gym_env_base, tmp_path, "summary", str(rows))
        assert f"1 rollout(s) never finished: task {tasks.index('policy_drops')} rollout 0" in terminal
        page = render_page(summarise([rows]), "")  # the report's page (plotly is not in Gym's venv)
        assert "backend overloaded" in page and "model · policy_model" in page and "never finished" in page


# -- recovery telemetry (issue 26): the same lane's retries, stalled rollout and outcomes -------


def lane_points(path: Path, name: str, service: str) -> list[dict[str, Any]]:
    """Every data point of metric ``name`` from ``service`` in an OTLP JSON lines file: sums,
    gauges and histograms alike (``value`` for the first two, ``count`` and ``sum`` for the last)."""
    found = []
    for line in path.read_text().splitlines():
        try:
            request = json.loads(line)
        except ValueError:
            continue  # the copy taken mid-run may end inside a line
        for resource in request.get("resourceMetrics", ()):
            if _attributes(resource["resource"].get("attributes")).get("service.name") != service:
                continue
            for scope in resource.get("scopeMetrics", ()):
                for metric in scope.get("metrics", ()):
                    if metric["name"] != name:
                        continue
                    for shape in ("sum", "gauge", "histogram"):
                        for point in metric.get(shape, {}).get("dataPoints", ()):
                            found.append(
                                {
                                    "time": int(point["timeUnixNano"]) / 1e9,
                                    "attributes": _attributes(point.get("attributes")),
                                    "value": float(point.get("asInt", point.get("asDouble", 0))),
                                    "count": int(point.get("count", 0)),
                                    "sum": float(point.get("sum", 0.0)),
                                }
                            )
    return found


def latest_by_series(points: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for point in points:
        key = tuple(sorted(point["attributes"].items()))
        if key not in latest or point["time"] >= latest[key]["time"]:
            latest[key] = point
    return latest


class TestRecoveryInTheLane:
    """What the lane's one run says of recovery: each retry loop counted once by outcome, the
    rollout that never answers in flight and stalled (``NG_OTEL_STALL_SECONDS=6``), and every
    rollout's outcome as collection decided it, equal to the coverage account of its files."""

    def test_a_model_that_drops_twice_then_answers_succeeded_after_retry_with_its_delay_observed(
        self, deployment: Deployment
    ):
        trace_id = deployment.fake_trace("DROPTWICE")
        attempts = [
            e
            for e, s in deployment.live.events()
            if s["trace_id"] == trace_id
            and s["service"] == "policy_model"
            and e["ng.failure.kind"] == "transport_peer_drop"
        ]
        assert [
            (e["http.request.resend_count"], e["ng.retry.exhausted"], e["ng.failure.recovered"]) for e in attempts
        ] == [
            (0, False, True),
            (1, False, True),
        ]
        outcomes = latest_by_series(lane_points(deployment.out / "otlp.jsonl", "ng.retry.outcomes", "policy_model"))
        after_retry = [
            p
            for p in outcomes.values()
            if p["attributes"]["ng.retry.outcome"] == "succeeded_after_retry"
            and p["attributes"]["ng.failure.kind"] == "transport_peer_drop"
        ]
        assert [(p["attributes"]["ng.failure.boundary"], p["value"]) for p in after_retry] == [("model", 1.0)]
        assert not [p for p in outcomes.values() if p["attributes"]["ng.retry.outcome"] == "failed_after_retry"]
        healthy = [p for p in outcomes.values() if p["attributes"]["ng.retry.outcome"] == "succeeded_without_retry"]
        assert healthy and all(p["attributes"]["ng.failure.kind"] == "none" for p in healthy)
        (delay,) = latest_by_series(
            lane_points(deployment.out / "otlp.jsonl", "ng.retry.delay", "policy_model")
        ).values()
        assert delay["attributes"] == {"ng.failure.boundary": "model", "ng.retry.outcome": "succeeded_after_retry"}
        assert delay["count"] == 1 and 1.0 <= delay["sum"] < 10.0  # Gym waits 0.5 s after each drop

    def test_the_rollout_that_never_answers_is_in_flight_stalled_and_one_event_in_its_trace(
        self, deployment: Deployment
    ):
        during = deployment.out / "during.jsonl"
        for metric, least in (("ng.rollouts.in_flight", 1), ("ng.rollouts.stalled", 1), ("ng.rollouts.oldest_age", 6)):
            points = lane_points(during, metric, "gym-eval-run")
            assert points and max(p["value"] for p in points) >= least, (metric, points[-3:])
        stalled = [(e, s) for e, s in deployment.during.events() if e.get("ng.rollout.stalled") is True]
        assert [
            (e["ng.failure.kind"], e["ng.failure.boundary"], e["ng.failure.recovered"], s["service"])
            for e, s in stalled
        ] == [("agent_timeout", "collection", True, "gym-eval-run")]
        event, span = stalled[0]
        assert span["trace_id"] == deployment.fake_trace("DROP")  # the hung rollout's own trace
        assert event["ng.rollout.age"] >= 6
        # Gym retries the dropped connection forever: every attempt retried, none the last.
        drops = [
            e
            for e, s in deployment.during.events()
            if s["trace_id"] == deployment.fake_trace("DROP") and e["ng.failure.kind"] == "transport_peer_drop"
        ]
        assert drops and all(e["ng.retry.exhausted"] is False for e in drops)

    def test_rollout_outcomes_are_counted_as_collection_decides_them_and_equal_the_coverage_account(
        self, deployment: Deployment
    ):
        from ng_otel.runs.coverage import read_run_coverage, run_files

        points = latest_by_series(lane_points(deployment.out / "otlp.jsonl", "ng.rollout.outcomes", "gym-eval-run"))
        counted: dict[tuple[str, str, str], float] = {}
        for point in points.values():
            key = tuple(point["attributes"][k] for k in ("ng.rollout.agent", "ng.rollout.outcome", "ng.failure.kind"))
            counted[key] = counted.get(key, 0) + point["value"]
        agent = "simpleqa_simple_agent"
        assert counted[(agent, "measured", "none")] == 2  # healthy, policy_drops_twice
        # Gym 0.7.0 routes the judge failure judge_failsafe masked to the sidecar: collection
        # decides it failed (judge_failed), as the coverage account of its files does.
        assert counted[(agent, "failed", "judge_failed")] == 1
        coverage = read_run_coverage(run_files(deployment.out / "run" / "rollouts.jsonl")).total
        for outcome in ("measured", "masked", "failed", "omitted"):
            total = sum(v for (_, o, _), v in counted.items() if o == outcome)
            assert total == getattr(coverage, outcome), (outcome, counted, coverage)
