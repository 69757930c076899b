"""docs/api.md is generated from the docstrings of the public names and must stay current."""

import importlib
import inspect
import runpy
from pathlib import Path

import ng_otel

ROOT = Path(__file__).resolve().parents[1]
generator = runpy.run_path(str(ROOT / "tools" / "gen_api.py"))


def test_api_reference_is_current():
    assert (ROOT / "docs" / "api.md").read_text() == generator["render"](), "run: python tools/gen_api.py"


def test_every_public_name_is_listed_and_documented():
    listed = set(generator["PUBLIC"]["ng_otel"])
    assert set(ng_otel.__all__) - {"__version__"} == listed
    for module_name, names in generator["PUBLIC"].items():
        module = importlib.import_module(module_name)
        for name in names:
            obj = getattr(module, name)
            obj = getattr(obj, "__wrapped__", obj)
            if isinstance(obj, frozenset):
                continue
            assert inspect.getdoc(obj), f"{module_name}.{name} has no docstring"
            if inspect.isclass(obj):
                for member, value in generator["members"](obj):
                    if member != "__init__":
                        assert inspect.getdoc(value), f"{module_name}.{name}.{member} has no docstring"


def test_every_public_signature_is_fully_annotated():
    for module_name, names in generator["PUBLIC"].items():
        module = importlib.import_module(module_name)
        for name in names:
            obj = getattr(getattr(module, name), "__wrapped__", getattr(module, name))
            if not callable(obj) or inspect.isclass(obj):
                continue
            signature = inspect.signature(obj)
            missing = [p for p in signature.parameters.values() if p.annotation is inspect.Parameter.empty]
            assert not missing and signature.return_annotation is not inspect.Signature.empty, name
