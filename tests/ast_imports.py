"""What a module imports, read from its AST: every form, wherever it stands, and how it runs.

Used by tests/test_layout.py (import cycles) and tests/test_boundaries.py (which package may import which).
Counted: `import a.b`, `from a import b`, relative imports (resolved against the module's package),
`from a import *`, and `importlib.import_module("a.b")` with a literal name. Each import records whether it
is lazy (inside a function, so it runs only when called) and type-only (under `if TYPE_CHECKING:`, so it
never runs); the checks decide which of those count.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# Our packages, the ones the import rules and the layout rules are about.
OURS = (
    "ctr_contract",
    "ctr_store",
    "ctr_features",
    "ctr_model",
    "training",
    "export",
    "serving",
    "pipelines",
    "bench",
)


@dataclass(frozen=True)
class Import:
    """One imported name, absolute and dotted: `from a.b import c` gives `a.b.c` (c may be a name in a.b)."""

    target: str
    line: int
    lazy: bool  # inside a function body: runs only when the function is called
    type_only: bool  # under `if TYPE_CHECKING:`: never runs, still ties the two modules

    @property
    def top(self) -> str:
        return self.target.split(".")[0]


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


def _is_import_module(node: ast.AST) -> str | None:
    """The literal name of `importlib.import_module("x")` / `import_module("x")`, else None."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    value = node.args[0].value
    return value if name == "import_module" and isinstance(value, str) and not value.startswith(".") else None


def imports(name: str, path: Path) -> list[Import]:
    """Every import of module `name` (its source at `path`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool, type_only: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, node.lineno, lazy, type_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from . import x`, `from ..y import z`
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                target = base if alias.name == "*" else f"{base}.{alias.name}" if base else alias.name
                found.append(Import(target, node.lineno, lazy, type_only))
        elif isinstance(node, ast.Call) and (literal := _is_import_module(node)) is not None:
            found.append(Import(literal, node.lineno, lazy, type_only))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for branch in node.body:
                visit(branch, lazy, True)
            for branch in node.orelse:
                visit(branch, lazy, type_only)
            return
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner, type_only)

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return found


def resolve(target: str, known: set[str] | dict[str, Path]) -> str | None:
    """The module among `known` that importing `target` loads: its longest known prefix (`a.b.name` -> `a.b`)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def parents(name: str) -> list[str]:
    """The packages whose `__init__` runs before module `name`: `a.b.c` -> [`a`, `a.b`]."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]
