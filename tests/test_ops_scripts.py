"""ops/bench (throughput, latency, cost, peers) and ops/experiments (the learning results) stay what their READMEs
say: modules run as ``python -m ops.<folder>.<name>`` from the repository root, sharing ops/benchlib.py and not each
other, without sys.path glue or imports of other modules' private names; every script is in its folder's index, and
the docs name only scripts that exist, in the form that runs. Reads sources and imports modules; starts nothing."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("bench", "experiments")
RUN_ELSEWHERE = {"ops.bench.pufferlib_side"}
"""Modules that run in another virtual environment (PufferLib's, .bench/pufferlib-venv), not importable here."""


def scripts(folder: str) -> list[Path]:
    return sorted(path for path in (REPO / "ops" / folder).glob("*.py") if path.name != "__init__.py")


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


ALL_SCRIPTS = [path for folder in FOLDERS for path in scripts(folder)]


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of everything ``path`` imports, functions' imports included (``from m import x``: m.x)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_no_script_changes_sys_path() -> None:
    wrong = [f"{path.relative_to(REPO)}:{number}" for path in [*ALL_SCRIPTS, REPO / "ops" / "benchlib.py"]
             for number, line in enumerate(path.read_text().splitlines(), 1) if "sys.path" in line]
    assert not wrong, "sys.path glue (run the script with python -m from the repository root instead):\n" + \
        "\n".join(wrong)


def test_bench_and_experiments_share_benchlib_not_each_other() -> None:
    wrong = [f"{path.relative_to(REPO)}:{line} imports {name}"
             for folder, other in (("bench", "experiments"), ("experiments", "bench")) for path in scripts(folder)
             for line, name in imports(path) if name.startswith(f"ops.{other}.")]
    assert not wrong, "\n".join(wrong)


def test_no_private_name_is_imported_from_another_module() -> None:
    def private(part: str) -> bool:
        return part.startswith("_") and not part.endswith("__")

    found = {f"{module_name(path)} imports {name}" for path in ALL_SCRIPTS for _, name in imports(path)
             if any(private(part) for part in name.split("."))}
    assert not found, "make them public, or move them:\n" + "\n".join(sorted(found))


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_script_is_in_its_folders_index(folder: str) -> None:
    index = (REPO / "ops" / folder / "README.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)` \|", index, flags=re.MULTILINE))
    assert listed == {path.stem for path in scripts(folder)}


def test_run_all_runs_bench_modules_that_exist() -> None:
    ran = re.findall(r"^\s*run (\w+)", (REPO / "ops" / "bench" / "run_all.sh").read_text(), flags=re.MULTILINE)
    assert ran and set(ran) <= {path.stem for path in scripts("bench")}


def test_docs_name_scripts_that_exist_in_the_form_that_runs() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "ops").glob("*/README.md"))]
    existing = {module_name(path) for path in ALL_SCRIPTS}
    wrong = []
    for doc in docs:
        text = doc.read_text()
        for folder, name in re.findall(r"ops/(bench|experiments)/(\w+)\.py", text):
            if f"ops.{folder}.{name}" not in existing:
                wrong.append(f"{doc.relative_to(REPO)}: ops/{folder}/{name}.py does not exist")
        for folder, name in re.findall(r"-m ops\.(bench|experiments)\.(\w+)", text):
            if f"ops.{folder}.{name}" not in existing:
                wrong.append(f"{doc.relative_to(REPO)}: no module ops.{folder}.{name}")
        for command in re.findall(r"(?:python\s+|^\s*)ops/(?:bench|experiments)/\w+\.py|ops/(?:bench|experiments)/\w+"
                                  r"\.py\s+--", text, flags=re.MULTILINE):
            wrong.append(f"{doc.relative_to(REPO)}: {command!r} runs a script by path "
                         f"(use python -m ops.<folder>.<name>)")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module", sorted({module_name(path) for path in ALL_SCRIPTS} - RUN_ELSEWHERE))
def test_every_script_imports(module: str) -> None:
    """What ``python -m`` needs before main(): the module's own imports resolve (the packages it uses move)."""
    importlib.import_module(module)
