"""Dependencies point one way: configs, protocol <- envs <- policies <- {actors, learner} <- evaluation.

Parses every module of the project's packages (imports inside functions included) and checks that each
package imports only packages below it, that ``actors`` and ``learner`` never import each other, and that
no module imports itself back through a circle of imports; and that no module imports a private name (a leading
underscore, dunders aside) from another module: what two modules share is public and has one owner.
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


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_imports(path: Path) -> list[str]:
    """``module:line name`` for every private name ``path`` imports from another module (``from m import _x``,
    ``import m._x``, ``from m._x import y``; relative imports and imports inside functions included)."""
    module = _module_name(path)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if any(_is_private(part) for part in alias.name.split("."))]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            source = "." * node.level + (node.module or "")
            private_source = any(_is_private(part) for part in (node.module or "").split("."))
            names = [f"{source}.{alias.name}" for alias in node.names if private_source or _is_private(alias.name)]
        else:
            continue
        found.extend(f"{module}:{node.lineno} imports {name}" for name in names)
    return found


def test_no_private_name_is_imported_from_another_module():
    files = [p for pkg in LAYER for p in sorted((REPO / pkg).rglob("*.py"))]
    wrong = [line for path in files for line in _private_imports(path)]
    assert not wrong, "private names imported from another module (make them public, or move them):\n" + \
        "\n".join(wrong)


def test_the_rule_catches_a_private_import(tmp_path, monkeypatch):
    """The checker itself: private names are reported, in every import form; public names and dunders are not."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "evaluation").mkdir()
    bad = tmp_path / "evaluation" / "bad.py"
    bad.write_text("from __future__ import annotations\nfrom learner.pool.store import Snapshot, _atomic_write\n"
                   "import learner._hidden\nfrom ._local import thing\nfrom learner import __version__\n"
                   "def f():\n    from learner.run.checkpoint import _fsync\n")
    assert sorted(_private_imports(bad)) == ["evaluation.bad:2 imports learner.pool.store._atomic_write",
                                             "evaluation.bad:3 imports learner._hidden",
                                             "evaluation.bad:4 imports ._local.thing",
                                             "evaluation.bad:7 imports learner.run.checkpoint._fsync"]


def test_packages_import_only_lower_layers():
    wrong = []
    for module, targets in _graph().items():
        top = module.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other != top and LAYER[other] >= LAYER[top]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports against the layer order:\n" + "\n".join(sorted(wrong))


LEARNER_LAYER = {"": 0, "ranks": 1, "monitor": 1, "ppo": 1, "coma": 1, "serve": 2, "pool": 3, "update": 4, "run": 5}
"""The learner's own order: its root (the entry, the loop, the build) above everything; ranks, monitor, ppo and coma
(peers that never import each other); serve (control, ingest); pool; update (what every algorithm's update stands
on); run (checkpoints, the run directory). A learner module imports its own sub-package and those below it only."""


def _learner_part(module: str) -> str:
    """The learner sub-package of a ``learner.*`` module ('' for the root's modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LEARNER_LAYER) else ""


def test_learner_sub_packages_import_only_lower_ones():
    assert {path.name for path in (REPO / "learner").iterdir() if path.is_dir() and path.name != "__pycache__"} \
        == set(LEARNER_LAYER) - {""}, "every learner sub-package has its place in LEARNER_LAYER"
    wrong = []
    for module, targets in _graph().items():
        if not module.startswith("learner."):
            continue
        part = _learner_part(module)
        for target in targets:
            other = _learner_part(target) if target.startswith("learner.") else None
            if other is not None and other != part and (LEARNER_LAYER[other] <= LEARNER_LAYER[part]):
                wrong.append(f"{module} imports {target}")
    assert not wrong, "learner imports against its sub-package order:\n" + "\n".join(sorted(wrong))


def test_the_learner_root_holds_only_the_entry_the_loop_and_the_build():
    root = {path.stem for path in (REPO / "learner").glob("*.py")}
    assert root == {"__init__", "__main__", "cli", "trainer", "follower", "stop_rules", "build"}


ENVS_ROOT = {"base", "spaces", "errors", "rows", "obs_layout"}
"""The envs interface at the root of envs/: the VecEnv contract, spaces, errors, rows and the flat layout of
structured observations. ``envs.builtin`` (the
shipped envs) and ``envs.adapters`` (what wraps a user's env) stand on these only, never on the registry or each
other; the interface stands on nothing else in envs; ``envs.registry`` reads both tables and ``envs.baseline_players``
(baseline names to players) stands on both too: the root's other modules."""
ENVS_SUB_PACKAGES = {"builtin", "adapters"}


def _envs_part(module: str) -> str:
    """The envs root module or sub-package an ``envs.*`` module is in ('' for the package ``envs`` itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _envs_wrong_imports(graph: dict[str, set[str]]) -> list[str]:
    """``module imports target`` for every import inside envs/ against ``ENVS_ROOT``'s rule."""
    wrong = []
    for module, targets in graph.items():
        if module.split(".")[0] != "envs":
            continue
        part = _envs_part(module)
        for target in targets:
            if target.split(".")[0] != "envs":
                continue
            other = _envs_part(target)
            if part in ENVS_ROOT or part in ENVS_SUB_PACKAGES:
                allowed = other in ENVS_ROOT or other == "" or other == part
            else:  # the registry, the baseline players, the package itself
                allowed = True
            if not allowed:
                wrong.append(f"{module} imports {target}")
    return sorted(wrong)


def test_envs_builtin_and_adapters_stand_on_the_envs_root_only():
    assert {path.name for path in (REPO / "envs").iterdir() if path.is_dir() and path.name != "__pycache__"} \
        == ENVS_SUB_PACKAGES, "every envs sub-package has its rule here"
    assert {path.stem for path in (REPO / "envs").glob("*.py")} == ENVS_ROOT | {"__init__", "registry",
                                                                                "baseline_players"}
    wrong = _envs_wrong_imports(_graph())
    assert not wrong, "envs imports against its layout (builtin and adapters import the envs root only):\n" + \
        "\n".join(wrong)


def test_the_envs_rule_catches_a_wrong_import():
    """The checker itself: builtin and adapters importing each other or the registry, or the interface importing
    either, is reported; imports of the interface, within a sub-package and by the registry are not."""
    graph = {"envs.adapters.native": {"envs.base", "envs.adapters.entry_point", "envs.builtin.cartpole"},
             "envs.builtin.cartpole": {"envs.spaces", "envs.errors", "envs.registry", "configs.env_config"},
             "envs.builtin.table": {"envs.builtin.cartpole", "envs.base"},
             "envs.base": {"envs.spaces", "envs.adapters.gym_spaces"},
             "envs.registry": {"envs.builtin.table", "envs.adapters.table", "envs.base"}}
    assert _envs_wrong_imports(graph) == ["envs.adapters.native imports envs.builtin.cartpole",
                                          "envs.base imports envs.adapters.gym_spaces",
                                          "envs.builtin.cartpole imports envs.registry"]


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
