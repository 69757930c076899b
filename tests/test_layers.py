"""The package's layers, read from its source: each package imports only the layers below it
(at module level and inside functions alike), and no modules import each other in a cycle."""

import ast
from pathlib import Path

import ng_otel

PACKAGE = Path(ng_otel.__file__).parent
ROOT_MODULES = {"ng_otel", "ng_otel._version", "ng_otel._compat"}  # the root package's light modules

# What each layer may import from ng_otel, besides itself. The root's other modules (the
# instrumentor, testing, the pytest plugin) and the command line sit above them all.
ALLOWED = {
    "contract": {"ng_otel._version"},
    "otel": {"contract", "ng_otel._compat", "ng_otel._version"},
    "integrations": {"contract", "otel", "ng_otel._compat", "ng_otel._version"},
    "runs": {"contract", "otel"},
    "gym": {"contract", "otel", "integrations", "runs", "ng_otel._version"},
}
# Third-party packages a layer must not import, whatever it needs: the data layers draw nothing.
FORBIDDEN_THIRD_PARTY = {"contract": {"opentelemetry", "rich", "aiohttp", "starlette", "fastapi"}, "runs": {"rich"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, *, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:  # `if TYPE_CHECKING:` imports nothing at run time
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # `from pkg import module`
    return found


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for module, path in MODULES.items():
        layer = layer_of(module)
        if layer not in ALLOWED:
            continue
        for name in imports(path, top_level_only=False):
            if not name.startswith("ng_otel"):
                if name.split(".")[0] in FORBIDDEN_THIRD_PARTY.get(layer, set()):
                    wrong.append(f"{module} imports {name}")
                continue
            if name not in MODULES:
                continue  # `from ng_otel.x import a_name`: the module itself is listed too
            target = layer_of(name)
            if target == layer or name in ROOT_MODULES & ALLOWED[layer] or target in ALLOWED[layer]:
                continue
            if name == "ng_otel":
                continue  # the package itself: parents are imported first whatever is imported
            wrong.append(f"{module} imports {name}")
    assert wrong == []


def test_no_modules_import_each_other_in_a_cycle():
    graph = {
        module: {name for name in imports(path, top_level_only=True) if name in MODULES and name != module}
        for module, path in MODULES.items()
    }
    # Tarjan's strongly connected components: a component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(component)

    for module in graph:
        if module not in index:
            visit(module)
    # A package's __init__ importing its own modules is how packages are written, not a cycle.
    real = [cycle for cycle in cycles if not all(module.startswith(min(cycle, key=len)) for module in cycle)]
    assert real == []
