"""The code stays readable: no function in src/ longer than a screen."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 60


def long_functions(root: Path = SRC) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines})")
    return found


def test_no_function_in_src_is_longer_than_60_lines():
    assert long_functions() == []


def test_the_check_finds_a_long_function(tmp_path: Path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n")
    assert long_functions(tmp_path) == [f"m.py:1 f ({MAX_LINES + 1})"]
