"""The shipped collector, compose and dashboard files, checked structurally: a user with
Docker gets a consistent whole, and no metric dimension is ever a reason or an id."""

import json
import re
from pathlib import Path

import pytest
import yaml

from ng_otel.otel import names

CONFIG = Path(__file__).resolve().parents[1] / "collector-config"
COLLECTORS = ["agent.yaml", "gateway.yaml", "sampler.yaml"]
KINDS = ("receivers", "processors", "exporters", "connectors")
UNBOUNDED = {names.REASON, names.ID, names.CAUSE_ID, names.FOREIGN_MESSAGE, names.OPERATION}


def load(name):
    return yaml.safe_load((CONFIG / name).read_text())


@pytest.mark.parametrize("name", COLLECTORS)
def test_every_component_is_defined_and_every_definition_is_used(name):
    config = load(name)
    defined = {kind: set(config.get(kind) or {}) for kind in KINDS}
    used = {kind: set() for kind in KINDS}
    for pipeline_name, pipeline in config["service"]["pipelines"].items():
        assert pipeline.get("receivers") and pipeline.get("exporters"), pipeline_name
        for role in ("receivers", "processors", "exporters"):
            for component in pipeline.get(role, []):
                kind = "connectors" if component in defined["connectors"] and role != "processors" else role
                assert component in defined[kind], f"{name}: {pipeline_name} uses undefined {component}"
                used[kind].add(component)
    for kind in KINDS:
        assert defined[kind] == used[kind], f"{name}: {kind} defined but unused: {defined[kind] - used[kind]}"
    for connector in defined["connectors"]:
        roles = [
            role
            for pipeline in config["service"]["pipelines"].values()
            for role in ("receivers", "exporters")
            if connector in pipeline.get(role, [])
        ]
        assert set(roles) == {"receivers", "exporters"}, f"{connector} must join two pipelines"
    assert set(config.get("extensions") or {}) == set(config["service"].get("extensions", []))


def test_count_connector_counts_ng_failure_events_by_bounded_dimensions_only():
    counts = load("agent.yaml")["connectors"]["count"]["spanevents"]
    (metric,) = counts.values()
    assert list(counts) == [names.SPAN_EVENTS_METRIC]
    assert metric["conditions"] == [f'name == "{names.EVENT}"']
    keys = {attribute["key"] for attribute in metric["attributes"]}
    assert keys == names.METRIC_LABELS
    assert not keys & UNBOUNDED


def test_transform_keeps_the_reason_bounded_on_failure_events():
    (statement,) = load("agent.yaml")["processors"]["transform/bound_reason"]["trace_statements"][0]["statements"]
    assert f'attributes["{names.REASON}"]' in statement and f'name == "{names.EVENT}"' in statement
    assert "Substring(" in statement and ", 0, 2000)" in statement


def test_sampler_keeps_every_trace_with_a_failure_event_and_gateway_routes_by_trace():
    policies = load("sampler.yaml")["processors"]["tail_sampling"]["policies"]
    assert policies[0]["ottl_condition"]["spanevent"] == [f'name == "{names.EVENT}"']
    assert policies[1]["type"] == "probabilistic"
    assert load("gateway.yaml")["exporters"]["loadbalancing"]["routing_key"] == "traceID"


def test_no_prometheus_rule_or_dashboard_groups_by_an_unbounded_attribute():
    unbounded = {name.replace(".", "_") for name in UNBOUNDED}
    bounded = {name.replace(".", "_") for name in names.METRIC_LABELS}
    # the recovery metrics' own bounded labels, a histogram's buckets, and Prometheus' target labels
    recovery = names.RETRY_LABELS | names.ROLLOUT_LABELS
    bounded |= {name.replace(".", "_") for name in recovery} | {"le", "job", "instance"}
    texts = [
        (CONFIG / "prometheus" / "rules.yaml").read_text(),
        (CONFIG / "grafana" / "dashboards" / "ng-failures.json").read_text(),
    ]
    for text in texts:
        for grouping in re.findall(r"by \(([^)]*)\)", text):
            labels = {label.strip() for label in grouping.split(",")}
            assert labels <= bounded, grouping
        assert not any(label in text for label in unbounded)


def test_compose_pins_every_image_and_binds_ports_to_loopback():
    compose = load("docker-compose.yaml")
    for name, service in compose["services"].items():
        image, _, tag = service["image"].rpartition(":")
        assert image and re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: {service['image']} is not pinned"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert (CONFIG / source).exists(), f"{name} mounts missing {source}"
    agent_version = compose["services"]["otel-agent"]["image"].rpartition(":")[2]
    for name in COLLECTORS:
        assert f"otelcol-contrib {agent_version}" in (CONFIG / name).read_text().splitlines()[0]


def test_dashboard_is_valid_json_querying_the_failure_metric():
    dashboard = json.loads((CONFIG / "grafana" / "dashboards" / "ng-failures.json").read_text())
    expressions = [t.get("expr", "") + t.get("query", "") for p in dashboard["panels"] for t in p["targets"]]
    assert any("ng_failures_total" in e or "ng:failures:" in e for e in expressions)
    assert any(f'event:name = "{names.EVENT}"' in e for e in expressions)
    datasources = load("grafana/provisioning/datasources/datasources.yaml")["datasources"]
    uids = {d["uid"] for d in datasources}
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} <= uids


def test_recording_rules_the_dashboard_uses_exist():
    recorded = {
        rule["record"]
        for group in load("prometheus/rules.yaml")["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    text = (CONFIG / "grafana" / "dashboards" / "ng-failures.json").read_text()
    used = set(re.findall(r"ng:[a-z0-9_:]+", text))
    assert used and used <= recorded
