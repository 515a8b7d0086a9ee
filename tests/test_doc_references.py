"""The docs and docstrings point at things that exist: every repository path (``learner/ppo/update.py``) and every
dotted name of a project module (``learner.ppo.advantage.compute_advantages``) written in README.md, docs/*.md, the
READMEs under ops/ and the Python sources resolves. A moved module or a renamed function otherwise leaves the prose
pointing at nothing, which is how a newcomer gets lost."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "learner", "protocol", "configs", "envs", "evaluation", "policies", "telemetry")
FOLDERS = (*PACKAGES, "ops", "tests", "docs", "examples")
PATH_RE = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*\w\.(?:py|md|yaml|sh|json|toml))" % "|".join(FOLDERS))
DOTTED_RE = re.compile(r"(?<![\w./-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(PACKAGES))


def _texts() -> list[Path]:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "ops").rglob("README.md"))]
    sources = [path for folder in FOLDERS if (REPO / folder).is_dir() for path in sorted((REPO / folder).rglob("*.py"))]
    return [path for path in docs + sources if "__pycache__" not in path.parts]


@cache
def _resolves(dotted: str) -> bool:
    """Whether the longest importable prefix of ``dotted`` has the name that follows it (names further on are
    attributes of that one, often set at run time, and are not checked)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return cut == len(parts) or hasattr(module, parts[cut])
    return False


def _is_reference(text: str, match: re.Match) -> bool:
    """A dotted word that names a module or something in one: three parts or more (``learner.ppo.update``), or two
    after ``python -m``, ``import`` or ``from`` (two parts alone are as often a config key: ``evaluation.games``)."""
    dotted = match.group(1)
    if text[match.end():match.end() + 1] in ("/", "-") or text[match.end():match.end() + 3] == ".py":
        return False
    if dotted.count(".") >= 2:
        return True
    before = text[max(0, match.start() - 10):match.start()]
    return before.endswith(("python -m ", "import ", "from "))


def _prose(path: Path) -> str:
    """What a reader reads as prose: a Markdown file whole; a Python file's docstrings and comments (its code names
    its own variables, ``learner.policy``, which are no references)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return text
    parts = [token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node, clean=False) or "")
        body = getattr(node, "body", None)
        if isinstance(body, list):  # attribute docstrings: a string statement after an assignment
            parts.extend(statement.value.value for statement in body
                         if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                         and isinstance(statement.value.value, str))
    return "\n".join(parts)


def _missing(path: Path) -> list[str]:
    text = _prose(path)
    missing = []
    for match in PATH_RE.finditer(text):
        mentioned = match.group(1)
        if not (REPO / mentioned).exists():
            missing.append(f"{path.relative_to(REPO)}: path {mentioned}")
    for match in DOTTED_RE.finditer(text):
        if _is_reference(text, match) and not _resolves(match.group(1)):
            missing.append(f"{path.relative_to(REPO)}: name {match.group(1)}")
    return missing


@pytest.mark.parametrize("path", _texts(), ids=lambda path: str(path.relative_to(REPO)))
def test_every_path_and_module_name_mentioned_exists(path: Path) -> None:
    assert _missing(path) == []
