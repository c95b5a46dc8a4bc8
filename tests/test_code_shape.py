"""Files a reader can hold, in src/, scripts/ and train.py: no function longer than a screen, no
module over 400 lines without a one-line reason at its top, and every import below module level
marked as lazy, with why."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 60
MAX_MODULE_LINES = 400
REASON = "# Over 400 lines: "  # a long module's first line (after a shebang), then its reason
LAZY = "# lazy: "  # on an import below module level (or the line above it), then why



def python_files(root: Path = REPO) -> list[Path]:
    """The modules checked: src/ (recursively), scripts/*.py and train.py."""
    files = [*(root / "src").rglob("*.py"), *(root / "scripts").glob("*.py"), root / "train.py"]
    return sorted(p for p in files if p.is_file())


def long_functions(root: Path = REPO) -> list[str]:
    found = []
    for path in python_files(root):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines})")
    return found


def _first_line(lines: list[str]) -> str:
    """A module's first line, after its shebang if it has one."""
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    return lines[0] if lines else ""


def long_modules_without_reason(root: Path = REPO) -> list[str]:
    """Modules over MAX_MODULE_LINES lines whose first line is not `# Over 400 lines: <reason>`,
    and modules no longer that long still carrying one (a stale reason)."""
    found = []
    for path in python_files(root):
        lines = path.read_text().splitlines()
        first = _first_line(lines)
        reasoned = first.startswith(REASON) and first[len(REASON):].strip() != ""
        if len(lines) > MAX_MODULE_LINES and not reasoned:
            found.append(f"{path.relative_to(root)} ({len(lines)} lines, no reason)")
        elif len(lines) <= MAX_MODULE_LINES and first.startswith(REASON):
            found.append(f"{path.relative_to(root)} ({len(lines)} lines, a stale reason)")
    return found


def _marked(lines: list[str], node: ast.stmt) -> bool:
    """`# lazy: <why>` on one of the import's lines, or alone on the line just above it."""
    own = lines[node.lineno - 1 : node.end_lineno]
    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    said = [line.split(LAZY, 1)[1].strip() for line in own if LAZY in line]
    if above.startswith(LAZY):
        said.append(above[len(LAZY):].strip())
    return any(said)


def _inner_imports(tree: ast.Module) -> list[ast.stmt]:
    """The import statements inside a function, method or class body (not module level; a
    module-level `if TYPE_CHECKING:` block is module level)."""
    found = []

    def visit(node: ast.AST, inner: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if inner and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            scope = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
            visit(child, inner or isinstance(child, scope))

    visit(tree, False)
    return found


def unmarked_lazy_imports(root: Path = REPO) -> list[tuple[str, int, str]]:
    """(path, line, statement) of each import below module level without `# lazy: <why>`."""
    found = []
    for path in python_files(root):
        text = path.read_text()
        lines = text.splitlines()
        for node in _inner_imports(ast.parse(text)):
            if not _marked(lines, node):
                statement = lines[node.lineno - 1].split("#", 1)[0].strip()
                found.append((path.relative_to(root).as_posix(), node.lineno, statement))
    return found


def test_no_function_is_longer_than_60_lines():
    assert long_functions() == []


def test_the_check_finds_a_long_function(tmp_path: Path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text(f"def f():\n{body}\n")
    assert long_functions(tmp_path) == [f"src/m.py:1 f ({MAX_LINES + 1})"]


def test_every_module_over_400_lines_says_why_on_its_first_line():
    assert long_modules_without_reason() == []


def test_the_check_finds_a_long_module_without_its_reason(tmp_path: Path):
    body = "".join(f"x{i} = {i}\n" for i in range(MAX_MODULE_LINES))
    (tmp_path / "scripts").mkdir()
    shebang = "#!/usr/bin/env python\n"
    (tmp_path / "scripts" / "ok.py").write_text(f"{shebang}{REASON}one figure\n{body}")
    (tmp_path / "scripts" / "bare.py").write_text(f'"""Doc."""\n{body}')
    (tmp_path / "scripts" / "empty.py").write_text(f"{REASON}\n{body}")  # a reason, not a prefix
    (tmp_path / "scripts" / "low.py").write_text(f"{REASON}it was long once\nx = 1\n")  # stale
    (tmp_path / "train.py").write_text(f"x = 0\n{REASON}not on the first line\n{body}")
    assert long_modules_without_reason(tmp_path) == [
        f"scripts/bare.py ({MAX_MODULE_LINES + 1} lines, no reason)",
        f"scripts/empty.py ({MAX_MODULE_LINES + 1} lines, no reason)",
        "scripts/low.py (2 lines, a stale reason)",
        f"train.py ({MAX_MODULE_LINES + 2} lines, no reason)",
    ]


def test_every_import_below_module_level_is_marked_lazy_with_why():
    assert unmarked_lazy_imports() == []


def test_the_check_finds_an_unmarked_import_below_module_level(tmp_path: Path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "m.py").write_text(
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import torch\n"
        "def marked():\n"
        "    import json  # lazy: only the report reads it\n"
        "    # lazy: torch loads in seconds\n"
        "    import torch\n"
        "    from pathlib import (  # lazy: an example of a wrapped import\n"
        "        Path,\n"
        "    )\n"
        "def unmarked():\n"
        "    import csv  # loads csv here\n"
        "    import json  # lazy:\n"
        "    # lazy: the line above a blank line does not count\n"
        "\n"
        "    import glob\n"
        "class C:\n"
        "    def m(self):\n"
        "        from os import path\n"
    )  # fmt: skip
    assert unmarked_lazy_imports(tmp_path) == [
        ("src/pkg/m.py", 13, "import csv"),
        ("src/pkg/m.py", 14, "import json"),
        ("src/pkg/m.py", 17, "import glob"),
        ("src/pkg/m.py", 20, "from os import path"),
    ]
