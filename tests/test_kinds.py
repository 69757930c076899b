import ast
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ng_otel.contract import kinds
from ng_otel.contract.kinds import FAILURE_KINDS, is_namespaced, is_registered, validate_failure_kind
from ng_otel.testing import fresh_state

SEED_KINDS = """transport_unreachable, transport_peer_drop, transport_timeout,
  transport_local_resource, agent_run_error, agent_request_failed, agent_timeout,
  agent_command_not_allowed, environment_server_failed, protocol_violation, judge_failed,
  judge_unparseable, verifier_error, provider_unavailable, provider_quota_exhausted,
  provider_oom_killed, session_lost, session_expired, session_release_failed, cancelled,
  kill_shaped, shutdown, persistence_failed, cohort_incomplete"""


def test_vocabulary_is_exactly_the_24_shared_names():
    expected = {name.strip() for name in SEED_KINDS.replace("\n", " ").split(",")}
    assert len(expected) == 24
    assert expected == FAILURE_KINDS


def test_every_name_is_lowercase_and_unique_modulo_case_and_separator():
    for name in FAILURE_KINDS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name)
    folded = {name.replace("_", "").lower() for name in FAILURE_KINDS}
    assert len(folded) == len(FAILURE_KINDS)


@pytest.mark.parametrize(
    ("name", "registered", "namespaced"),
    [
        ("transport_timeout", True, False),
        ("browser_crashed", False, False),
        ("swe:patch_failed", False, True),
        ("Swe:patch", False, False),
        ("swe:", False, False),
        (":patch", False, False),
        ("a:b:c", False, False),
        ("swe:patch\n", False, False),
        (None, False, False),
    ],
)
def test_lookup(name, registered, namespaced):
    assert is_registered(name) is registered
    assert is_namespaced(name) is namespaced


@pytest.fixture
def fresh_warnings():
    with fresh_state():
        yield


def test_validation_is_silent_on_known_and_namespaced_names(fresh_warnings, caplog):
    with caplog.at_level(logging.WARNING, logger="ng_otel"):
        assert validate_failure_kind("judge_failed") == "judge_failed"
        assert validate_failure_kind("swe:patch_failed") == "swe:patch_failed"
    assert caplog.records == []


def test_unknown_name_warns_once_and_is_returned(fresh_warnings, caplog):
    with caplog.at_level(logging.WARNING, logger="ng_otel"):
        for _ in range(3):
            assert validate_failure_kind("browser_crashed") == "browser_crashed"
        assert validate_failure_kind("Not A Kind") == "Not A Kind"
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    assert "unregistered" in messages[0] and "browser_crashed" in messages[0]
    assert "malformed" in messages[1]


def test_warning_memory_is_bounded(fresh_warnings):
    for index in range(kinds._MAX_REMEMBERED_WARNINGS + 50):
        validate_failure_kind(f"made_up_{index}")
    assert len(kinds._warned) == kinds._MAX_REMEMBERED_WARNINGS


def test_contract_imports_no_telemetry_or_framework():
    code = (
        "import sys, ng_otel, ng_otel.contract;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('opentelemetry', 'fastapi', 'starlette', 'aiohttp', 'grpc', 'uvicorn')];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_contract_code_imports_only_the_standard_library_pydantic_typing_extensions_and_orjson():
    allowed = set(sys.stdlib_module_names) | {"pydantic", "typing_extensions", "orjson", "ng_otel"}
    contract = Path(kinds.__file__).parent
    imported = {}
    for path in contract.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                # Inside the package only the contract itself: never ng_otel.otel or the adapters.
                top = (
                    name
                    if name.startswith("ng_otel.") and not name.startswith("ng_otel.contract")
                    else name.split(".")[0]
                )
                imported.setdefault(top, set()).add(path.name)
    assert {top: files for top, files in imported.items() if top not in allowed} == {}
    assert {"pydantic", "orjson"} <= set(imported)


def test_any_value_from_a_file_may_be_asked_whether_it_is_a_kind():
    # kinds --check asks of whatever a row holds: a list or an object is no kind, not a TypeError.
    for value in ([1, 2], {"a": 1}, None, 3, ""):
        assert not kinds.is_registered(value) and not kinds.is_namespaced(value)
