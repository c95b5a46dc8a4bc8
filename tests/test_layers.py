"""Imports point down the layers only: nothing below imports anything above (DESIGN.md,
"Direction of the design"). Lazy imports inside functions count as imports."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# low to high; a module may import its own layer and those below. A package's name stands for
# its modules (normlab.run.* is "run"); a name a layer does not list fails the test.
LAYERS = [
    ("normlab", "errors", "tables", "compute", "console", "files", "identity", "suggest",
     "layout"),
    ("norms",),
    ("config", "data", "models", "tasks", "preflight", "fid", "loggers"),
    ("callbacks", "fid_train"),
    ("run", "train"),  # train: the entry point (normlab-train, train.py, a sweep's multiruns)
    ("sweep", "bench"),
    ("analysis",),
    ("scripts", "train.py"),
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def part(module: str) -> str:
    """The layer name of a dotted module: normlab.run.task -> run, normlab -> normlab."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import of normlab in tree, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("normlab")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "normlab":  # from normlab import run: the module run
                found += [(node.lineno, f"normlab.{a.name}") for a in node.names]
            elif node.module.startswith("normlab."):
                found.append((node.lineno, node.module))
    return found


def sources(repo: Path) -> list[tuple[str, Path]]:
    """(layer name, file) of normlab's modules, the scripts and train.py."""
    src = repo / "src" / "normlab"
    files = [(part("normlab." + ".".join(p.relative_to(src).with_suffix("").parts)), p)
             for p in sorted(src.rglob("*.py"))]  # fmt: skip
    files = [("normlab" if name == "__init__" else name, p) for name, p in files]
    files += [("scripts", p) for p in sorted((repo / "scripts").glob("*.py"))]
    return [*files, ("train.py", repo / "train.py")]


def upward_imports(repo: Path = REPO) -> list[str]:
    """'file:line importer -> imported' for each import of a higher layer (or of a name no
    layer lists)."""
    found = []
    for name, path in sources(repo):
        for line, module in imported(ast.parse(path.read_text())):
            target = part(module)
            if LAYER.get(name, -1) < LAYER.get(target, len(LAYERS)):
                found.append(f"{path.relative_to(repo)}:{line} {name} -> {module}")
    return found


def test_no_import_points_up_a_layer():
    assert upward_imports() == []


def test_every_module_has_a_layer():
    assert sorted({name for name, _ in sources(REPO)} - LAYER.keys()) == []


def test_the_check_finds_an_import_pointing_up(tmp_path: Path):
    (tmp_path / "src" / "normlab" / "norms").mkdir(parents=True)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "train.py").write_text("import normlab.run\n")
    (tmp_path / "src" / "normlab" / "norms" / "x.py").write_text(
        "def f():\n    from normlab.sweep import jobs\n"
    )
    assert upward_imports(tmp_path) == ["src/normlab/norms/x.py:2 norms -> normlab.sweep"]
