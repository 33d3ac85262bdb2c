"""The packages have rooms: few top-level modules, sub-packages, short modules and no import cycles.

An import cycle is counted between modules of one package: `import a.b`, `from a import b` (b a module) and
relative imports, wherever they stand in the module (a lazy import inside a function still ties two modules),
except under `if TYPE_CHECKING:`. Importing `a.b.c` also runs the `__init__` files above it; those implicit
edges are left out, so a package's `__init__` re-exporting its modules is not called a cycle.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

PACKAGES = ("serving", "training", "bench")
MAX_TOP_LEVEL_MODULES = 12
MIN_SUB_PACKAGES = 2
MAX_LINES = 400


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` under `root`, by dotted name (a package's `__init__.py` by the package's name)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements under `node`, leaving out the bodies of `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for branch in child.orelse:
                found += _imports(ast.Module(body=[branch], type_ignores=[]))
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            found.append(child)
        found += _imports(child)
    return found


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules among `known` that module `name` (at `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # `from . import x`, `from ..y import z`
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
            candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for candidate in candidates:
            # `import a.b.c` where only `a.b` is ours (c a name in it) ties to the longest known prefix.
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


def import_cycle(root: Path, package: str) -> list[str] | None:
    """One import cycle between the modules of `package` (first module repeated at the end), or None."""
    found = modules(root, package)
    graph = {name: imported_modules(name, path, set(found)) for name, path in found.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_package_keeps_at_most_twelve_modules_at_its_top_level(package: str) -> None:
    top = sorted(p.name for p in (REPO_ROOT / package).glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{package}/ holds {len(top)} modules at its top level: {top}"


@pytest.mark.parametrize("package", PACKAGES)
def test_package_has_at_least_two_sub_packages(package: str) -> None:
    rooms = sorted(p.parent.name for p in (REPO_ROOT / package).glob("*/__init__.py"))
    assert len(rooms) >= MIN_SUB_PACKAGES, f"{package}/ has {len(rooms)} sub-packages: {rooms}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_400_lines(package: str) -> None:
    long = {
        name: n
        for name, path in modules(REPO_ROOT, package).items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_between_modules(package: str) -> None:
    cycle = import_cycle(REPO_ROOT, package)
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_cycle_check_follows_relative_lazy_and_from_package_imports(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.sub import b\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/b.py": "def f():\n    from ..c import g\n",
            "pkg/c.py": "from . import a\ng = 1\n",
        },
    )

    assert import_cycle(tmp_path, "pkg") == ["pkg.a", "pkg.c", "pkg.sub.b", "pkg.a"]


def test_cycle_check_skips_type_checking_imports_and_parent_packages(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "from typing import TYPE_CHECKING\nimport pkg.b\nA = 1\n",
            "pkg/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.a import A\nelse:\n    import json\n",
        },
    )

    assert import_cycle(tmp_path, "pkg") is None
    assert imported_modules("pkg.a", tmp_path / "pkg" / "a.py", set(modules(tmp_path, "pkg"))) == {"pkg.b"}
