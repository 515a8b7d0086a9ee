"""Dependencies point one way: configs, protocol <- envs <- policies <- {actors, learner} <- evaluation.

Parses every module of the project's packages (imports inside functions included) and checks that each
package imports only packages below it, that ``actors`` and ``learner`` never import each other, and that
no module imports itself back through a circle of imports.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LAYER = {"configs": 0, "protocol": 0, "telemetry": 0, "envs": 1, "policies": 2, "actors": 3, "learner": 3, "evaluation": 4,
         "examples": 4}
"""Each package's place in the order: a package may import its own modules and those of lower layers only."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of the project modules ``path`` imports (relative imports resolved)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in LAYER}


def _graph() -> dict[str, set[str]]:
    """Project module -> project modules it imports (names that are attributes, not modules, dropped)."""
    files = {_module_name(p): p for pkg in LAYER for p in (REPO / pkg).rglob("*.py")}
    return {name: {target for target in _imports(path) if target in files and target != name}
            for name, path in files.items()}


def test_packages_import_only_lower_layers():
    wrong = []
    for module, targets in _graph().items():
        top = module.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other != top and LAYER[other] >= LAYER[top]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports against the layer order:\n" + "\n".join(sorted(wrong))


def test_no_import_circles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_rule_catches_a_wrong_import(tmp_path, monkeypatch):
    """The checker itself: a policies module importing actors is reported."""
    fake = tmp_path / "policies"
    fake.mkdir()
    (fake / "bad.py").write_text("from actors.inference import Inference\n")
    (tmp_path / "actors").mkdir()
    (tmp_path / "actors" / "inference.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    for pkg in LAYER:
        (tmp_path / pkg).mkdir(exist_ok=True)
    graph = _graph()
    assert graph["policies.bad"] == {"actors.inference"}
