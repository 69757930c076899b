"""The docs cannot drift from the code: the conventions table is checked against the names
module, the configuration table against the settings, and every env var ng_otel reads."""

import re
from pathlib import Path

from ng_otel.otel import names
from ng_otel.otel.settings import PARAMS, Settings, variables_table

DOCS = Path(__file__).resolve().parents[1] / "docs"

# The constants that name something a user sees in telemetry or on the wire.
PUBLIC = [
    "EVENT",
    "BOUNDARY",
    "KIND",
    "STAGE",
    "RECOVERED",
    "CLASS",
    "ID",
    "CAUSE_ID",
    "REASON",
    "OPERATION",
    "FOREIGN_TYPE",
    "FOREIGN_MESSAGE",
    "HTTP_STATUS",
    "RESEND_COUNT",
    "HTTP_METHOD",
    "URL_FULL",
    "ERROR_TYPE",
    "LINK_TYPE",
    "VERIFY_MASKED",
    "FAILURES_METRIC",
    "VERIFY_METRIC",
    "OMITTED_METRIC",
    "SPAN_EVENTS_METRIC",
    "REPORT_HEADER",
    "CONTEXT_HEADER",
    "SSE_EVENT",
    "SSE_CONTEXT_EVENT",
    "ROW_CONTEXTS",
    "REPLAY_SPAN",
]


def table_names(text):
    first_cells = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]
    return {name for cell in first_cells for name in re.findall(r"`([^`]+)`", cell)}


def test_conventions_table_and_names_module_agree():
    documented = table_names((DOCS / "conventions.md").read_text())
    documented = {name.replace("<kind>", "").rstrip() + (" " if "<kind>" in name else "") for name in documented}
    values = {getattr(names, constant) for constant in PUBLIC} | {names.LATE_SPAN_PREFIX}
    assert values <= documented, f"undocumented: {values - documented}"
    every_value = {value for key, value in vars(names).items() if key.isupper() and isinstance(value, str)}
    assert documented <= every_value, f"documented but not in names.py: {documented - every_value}"


def test_units_and_link_types_are_documented_as_emitted():
    text = (DOCS / "conventions.md").read_text()
    for unit in (names.FAILURES_UNIT, names.VERIFY_UNIT, names.OMITTED_UNIT):
        assert f"`{unit}`" in text
    for link_type in (names.LINK_CAUSED_BY, names.LINK_REPLAY_OF):
        assert f"`{link_type}`" in text


def test_the_configuration_table_is_made_from_the_settings_declarations():
    text = (DOCS / "configuration.md").read_text()
    assert variables_table() in text
    declared = {param.variable for param in PARAMS}
    source = Path(__import__("ng_otel").__file__).parent
    read = set()
    for path in source.rglob("*.py"):
        read |= set(re.findall(r'"(NG_OTEL_[A-Z_]+)"', path.read_text()))
    assert read <= declared, f"read but not declared: {read - declared}"
    assert [param.attribute for param in PARAMS] == [f for f in Settings.__dataclass_fields__ if f != "sources"]
    assert all(getattr(Settings(), param.attribute) == param.default for param in PARAMS)
