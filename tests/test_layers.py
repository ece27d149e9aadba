"""The architecture, checked on the source (docs/architecture.md): no import circle in ``src/``, backends that do not
import each other, and layers that use only each other's public names."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
FORBIDDEN = {  # layer -> layers it must not import
    "servetune.ray": ("servetune.server",),
    "servetune.server": ("servetune.ray",),
    "servetune.api": ("servetune.server", "servetune.ray", "servetune.tune", "servetune.bench"),
    "servetune.tune": ("servetune.server", "servetune.api"),
    "servetune.bench": ("servetune.server", "servetune.api", "servetune.ray", "servetune.tune"),
    "servetune.handlers": ("servetune.server", "servetune.ray", "servetune.api", "servetune.tune"),
    # the online controller is backend-neutral: the backends drive it, never the other way round
    "servetune.control": ("servetune.server", "servetune.ray", "servetune.tune", "servetune.bench", "servetune.cli"),
}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "servetune").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path: Path, name: str) -> list[tuple[str, list[str]]]:
    """(module, names) for every ``import``/``from ... import`` of a servetune module, wherever it stands, except under
    ``if TYPE_CHECKING:`` (annotations, not dependencies at run time)."""
    out = []
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    typing_only = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for child in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base.startswith("servetune"):
                out.append((base, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names if a.name.startswith("servetune"))
    return out


def layer_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_import_circle() -> None:
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for module, names in imports(path, name):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in known] or [module]
            graph[name].update(t for t in targets if t in known and t != name)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own modules
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(nxt) :] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_layers_import_only_what_they_may_and_only_public_names() -> None:
    problems = []
    for name, path in modules().items():
        layer = layer_of(name)
        for module, names in imports(path, name):
            if layer_of(module) == layer:
                continue
            if any(module == f or module.startswith(f + ".") for f in FORBIDDEN.get(layer, ())):
                problems.append(f"{name} imports {module}")
                continue
            imported = importlib.import_module(module)
            public = getattr(imported, "__all__", None)
            for item in names:
                submodule = hasattr(imported, "__path__") and importlib.util.find_spec(f"{module}.{item}") is not None
                dunder = item.startswith("__")
                if (item.startswith("_") and not dunder) or (
                    public is not None and item not in public and not submodule | dunder
                ):
                    problems.append(f"{name} imports {module}.{item}, which is not public")
    assert not problems, "\n".join(problems)


# Exceptions outside the one tree, each with its reason in servetune/_exceptions.py's docstring.
OUTSIDE_THE_TREE = {
    "servetune.handlers.util.PredictionException",  # the handler contract's (``ts.utils.util``)
    "servetune.handlers.util.BadInputError",
    "servetune.api.http_limits._Refused",  # private signals, caught in their own module
    "servetune.config.model_yaml._Refused",
}


def _exception_classes() -> dict[str, list[str]]:
    """module -> the classes it defines that derive (by name, to a fixpoint) from an exception: found on the source,
    so that only those modules are imported."""
    trees = {name: ast.parse(path.read_text()) for name, path in modules().items()}
    classes = {
        name: [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)] for name, tree in trees.items()
    }
    known: set[str] = set()
    while True:
        found = {
            node.name
            for nodes in classes.values()
            for node in nodes
            for base in node.bases
            if (base_name := ast.unparse(base).rsplit(".", 1)[-1]) in known
            or base_name.endswith(("Error", "Exception"))
        }
        if found <= known:
            break
        known |= found
    return {
        name: [n.name for n in nodes if n.name in known]
        for name, nodes in classes.items()
        if any(n.name in known for n in nodes)
    }


def test_every_exception_is_in_the_one_tree() -> None:
    from servetune._exceptions import ServetuneError

    outside = []
    for name, class_names in _exception_classes().items():
        module = importlib.import_module(name)
        for class_name in class_names:
            found = getattr(module, class_name)
            assert isinstance(found, type) and issubclass(found, BaseException), f"{name}.{class_name}"
            if not issubclass(found, ServetuneError):
                outside.append(f"{name}.{class_name}")
    assert sorted(outside) == sorted(OUTSIDE_THE_TREE)
    documented = (SRC / "servetune" / "_exceptions.py").read_text()
    assert all(qualified.rsplit(".", 1)[1] in documented for qualified in outside)
