"""The marks stay true: a test that starts processes is marked ``integration``, so the inner loop
(``bash ops/test.sh --fast``, i.e. ``-m "not integration and not slow"``) never starts one.

Read from each test module's source: a test that uses a process starter (subprocess, multiprocessing, a process
pool, os.fork / system / exec, tests.netns, tests.processes' ``start`` and ``Run``, WorkerPool, probe_env_spec)
directly, through a helper, fixture or class of its module, or through a helper imported from another test module,
must carry the mark: ``pytestmark = pytest.mark.integration`` near the imports, a class ``pytestmark``, or
``@pytest.mark.integration`` on the test. tests/conftest.py checks the same while the tests run, for starts the
source cannot show (a library call that spawns a child).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# modules whose every use starts a process
STARTER_MODULES = {"subprocess", "multiprocessing", "torch.multiprocessing", "pty", "tests.netns",
                   "torch.distributed.run", "torch.distributed.launcher", "torch.distributed.elastic"}
# names that start a process, by the module they come from
STARTER_NAMES = {
    "tests.processes": {"start", "Run"},
    "concurrent.futures": {"ProcessPoolExecutor"},
    "concurrent.futures.process": {"ProcessPoolExecutor"},
    "envs.registry": {"probe_env_spec"},
    "actors.worker_pool": {"WorkerPool"},
    "learner.monitor.evaluator_process": {"EvaluatorProcess"},
    "os": {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp",
           "execvpe", "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl",
           "spawnle", "spawnlp", "spawnlpe"},
}


def _is_integration_mark(node: ast.AST | None) -> bool:
    """True if the expression names pytest.mark.integration anywhere (alone, in a list, called)."""
    return node is not None and any(isinstance(n, ast.Attribute) and n.attr == "integration"
                                    and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
                                    for n in ast.walk(node))


def _pytestmark(body: list[ast.stmt]) -> bool:
    return any(isinstance(stmt, (ast.Assign, ast.AnnAssign))
               and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                       for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]))
               and _is_integration_mark(stmt.value) for stmt in body)


def _imported_starters(stmt: ast.stmt) -> dict[str, str]:
    """The names an import statement binds that start a process, each with the reason (tests modules followed)."""
    starters: dict[str, str] = {}
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            if alias.name in STARTER_MODULES or alias.name.split(".")[0] in {"subprocess", "multiprocessing"}:
                starters[alias.asname or alias.name.split(".")[0]] = alias.name
    elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
        for alias in stmt.names:
            local = alias.asname or alias.name
            if stmt.module in STARTER_MODULES or f"{stmt.module}.{alias.name}" in STARTER_MODULES:
                starters[local] = f"{stmt.module}.{alias.name}"
            elif alias.name in STARTER_NAMES.get(stmt.module, ()):
                starters[local] = f"{stmt.module}.{alias.name}"
            elif stmt.module.startswith("tests.") and alias.name in module_starters(stmt.module):
                starters[local] = f"{stmt.module}.{alias.name} ({module_starters(stmt.module)[alias.name]})"
    return starters


def _references(node: ast.AST, starters: dict[str, str]) -> str | None:
    """Why ``node`` starts a process (the starter it reaches), or None."""
    local: dict[str, str] = {}
    for n in ast.walk(node):
        if isinstance(n, (ast.Import, ast.ImportFrom)):  # an import inside a function
            local.update(_imported_starters(n))
    if local:
        starters = {**starters, **local}
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in starters:
            return starters[n.id]
        if isinstance(n, ast.arg) and n.arg in starters:  # a fixture of the module, by its parameter name
            return starters[n.arg]
        if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "os"
                and n.attr in STARTER_NAMES["os"]):
            return f"os.{n.attr}"
    return None


@functools.lru_cache(maxsize=None)
def module_starters(module: str) -> dict[str, str]:
    """The module-level names of a tests module that start a process, each with the reason."""
    path = TESTS / (module.split(".", 1)[-1].replace(".", "/") + ".py")  # tests.x is TESTS / x.py
    if not path.exists():
        return {}
    tree = ast.parse(path.read_text(), filename=str(path))
    starters: dict[str, str] = {}
    for stmt in tree.body:
        starters.update(_imported_starters(stmt))
    defs = [stmt for stmt in tree.body if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    changed = True
    while changed:  # helpers that call helpers: until nothing new starts a process
        changed = False
        for stmt in defs:
            if stmt.name not in starters:
                reason = _references(stmt, starters)
                if reason is not None:
                    starters[stmt.name] = f"{stmt.name} -> {reason}" if not reason.startswith(stmt.name) else reason
                    changed = True
    return starters


def unmarked_process_tests(path: Path) -> list[str]:
    """``file::test uses X`` for each test in ``path`` that starts a process and is not marked integration."""
    module = f"tests.{path.stem}"
    tree = ast.parse(path.read_text(), filename=str(path))
    if _pytestmark(tree.body):
        return []
    starters = module_starters(module)
    found = []
    for stmt in tree.body:
        tests: list[tuple[str, ast.AST, bool]] = []
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name.startswith("test"):
            tests.append((stmt.name, stmt, any(_is_integration_mark(d) for d in stmt.decorator_list)))
        elif isinstance(stmt, ast.ClassDef) and stmt.name.startswith("Test"):
            marked = _pytestmark(stmt.body) or any(_is_integration_mark(d) for d in stmt.decorator_list)
            for item in stmt.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                    tests.append((f"{stmt.name}::{item.name}", item,
                                  marked or any(_is_integration_mark(d) for d in item.decorator_list)))
            # a fixture or helper method of the class reaches a starter: the whole class counts
            if not marked and _references(stmt, starters) is not None:
                tests = [(name, stmt, is_marked) for name, _, is_marked in tests]
        for name, node, is_marked in tests:
            reason = None if is_marked else _references(node, {k: v for k, v in starters.items() if k != name})
            if reason is not None:
                found.append(f"tests/{path.name}::{name} starts a process ({reason}) and is not marked integration")
    return found


def test_every_test_that_starts_a_process_is_marked_integration():
    found = [line for path in sorted(TESTS.glob("test_*.py")) for line in unmarked_process_tests(path)]
    assert not found, ("\n".join(found) + "\nadd `pytestmark = pytest.mark.integration` near the module's imports "
                       "(or @pytest.mark.integration on the test): bash ops/test.sh --fast must not start processes")


def test_the_guard_sees_starters_directly_through_helpers_fixtures_and_other_test_modules(tmp_path, monkeypatch):
    source = '''
import subprocess
import pytest
from tests.processes import Run, wait_for

def _helper():
    return subprocess.run(["true"])

@pytest.fixture
def run(tmp_path):
    return Run(tmp_path)

def test_direct():
    subprocess.run(["true"])

def test_helper():
    _helper()

def test_fixture(run):
    pass

def test_pure():
    wait_for(lambda: True, 1)

@pytest.mark.integration
def test_marked():
    _helper()
'''
    monkeypatch.setattr(f"{__name__}.TESTS", tmp_path)
    module_starters.cache_clear()
    try:
        (tmp_path / "test_sample.py").write_text(source)
        found = unmarked_process_tests(tmp_path / "test_sample.py")
        assert [line.split("::")[1].split()[0] for line in found] == ["test_direct", "test_helper", "test_fixture"]
        assert "_helper -> subprocess" in found[1] and "tests.processes.Run" in found[2]
        (tmp_path / "test_sample.py").write_text(source.replace("import pytest\n",
                                                                "import pytest\npytestmark = pytest.mark.integration\n"))
        assert unmarked_process_tests(tmp_path / "test_sample.py") == []
    finally:
        module_starters.cache_clear()


def test_conftest_does_nothing_at_import():
    """tests/conftest.py holds imports, constants and hooks only: importing it changes nothing."""
    tree = ast.parse((TESTS / "conftest.py").read_text())
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the docstring
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None and all(
                isinstance(n.func, ast.Name) and n.func.id in {"frozenset", "tuple"}
                for n in ast.walk(stmt.value) if isinstance(n, ast.Call)):
            continue  # a constant
        assert isinstance(stmt, allowed), f"tests/conftest.py line {stmt.lineno} runs code at import"
