"""Every package has rooms: few modules to a folder, short modules, no cycles, no packing tricks.

The rules, for every package of ours (`tests.ast_imports.OURS`) and every room in it:
- at most 12 modules in any folder (a package's top level and each sub-package), `__init__`/`__main__` counted;
- no module over 400 lines (the lint runs `ruff format --check`, so a line is ruff's default line);
- a package of more than 12 modules in all has at least 2 sub-packages;
- no import cycle between a package's modules: `import a.b`, `from a import b` (b a module), relative imports,
  lazy imports inside a function (they still tie two modules) and type-only imports under `if TYPE_CHECKING:`
  (a cycle hidden from the interpreter is still a cycle in the design). Importing `a.b.c` also runs the
  `__init__` files above it; those implicit edges are left out, so an `__init__` naming its modules is no cycle;
- at most 10 `# fmt: skip`/`# fmt: off` comments in the whole repository, tests included (tables of data only);
- no shim module (`is_shim` says exactly what one is);
- no write into a frozen dataclass (`object.__setattr__`, `x.__dict__[k] = v`, `vars(x)[k] = v`,
  `x.__dict__.update(...)`): a type that changes is not frozen, or the change makes a new value.
"""

from __future__ import annotations

import ast
import graphlib
import io
import tokenize
from pathlib import Path

import pytest

from tests.ast_imports import OURS, imports, modules, resolve
from tests.helpers import REPO_ROOT

MAX_MODULES_PER_FOLDER = 12
MIN_SUB_PACKAGES = 2
MAX_LINES = 400
MAX_FMT_SKIPS = 10
# Folders of the repository that are not its source: virtual environments, caches, build and run outputs.
NOT_SOURCE = {"build", "artifacts", "results", "node_modules", "__pycache__"}


def python_files(root: Path) -> list[Path]:
    """The repository's own .py files, wherever they are (hidden folders, `.venv*` and `NOT_SOURCE` left out)."""
    return sorted(
        p
        for p in root.rglob("*.py")
        if not any(part.startswith(".") or part in NOT_SOURCE for part in p.relative_to(root).parts[:-1])
    )


def folders(root: Path, package: str) -> dict[str, list[str]]:
    """Each folder of `package` that holds modules -> the names of the modules directly in it."""
    found: dict[str, list[str]] = {}
    for path in modules(root, package).values():
        found.setdefault(path.parent.relative_to(root).as_posix(), []).append(path.name)
    return found


def import_cycle(root: Path, package: str) -> list[str] | None:
    """One import cycle between the modules of `package` (first module repeated at the end), or None."""
    found = modules(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        targets = {resolve(i.target, found) for i in imports(name, path)}
        graph[name] = {t for t in targets if t is not None and t != name}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


def fmt_skips(path: Path) -> list[int]:
    """The lines of `path` that carry a `# fmt: skip` or `# fmt: off` comment (comments only, not strings)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [t.start[0] for t in tokens if t.type == tokenize.COMMENT and _is_fmt_pragma(t.string)]


def _is_fmt_pragma(comment: str) -> bool:
    return comment.lstrip("#").strip().startswith(("fmt: skip", "fmt: off"))


def _is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":`"""
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)):
        return False
    left, right = node.test.left, node.test.comparators[0]
    return (
        isinstance(left, ast.Name)
        and left.id == "__name__"
        and isinstance(right, ast.Constant)
        and right.value == "__main__"
        and not node.orelse
    )


def _is_entry_call(node: ast.expr | None, mains: set[str]) -> bool:
    """`main()`, `main(argv)`, `sys.exit(main())` or `SystemExit(main())`, `main` being an imported `main`."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name) and func.id in mains:
        return True
    wraps = (isinstance(func, ast.Attribute) and func.attr == "exit") or (
        isinstance(func, ast.Name) and func.id in ("exit", "SystemExit")
    )
    return wraps and len(node.args) == 1 and _is_entry_call(node.args[0], mains)


def _only_forwards(body: list[ast.stmt], mains: set[str]) -> bool:
    """Whether `body` holds nothing but imports, `__all__`, and calls of an imported `main`."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Assign | ast.AnnAssign):
            names = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) and t.id == "__all__" for t in names):
                continue
        if isinstance(node, ast.Expr) and _is_entry_call(node.value, mains):
            continue
        if isinstance(node, ast.Raise) and _is_entry_call(node.exc, mains):
            continue
        if isinstance(node, ast.If) and _is_main_guard(node) and _only_forwards(node.body, mains):
            continue
        return False
    return True


def is_shim(root: Path, path: Path, ours: tuple[str, ...] = OURS) -> bool:
    """Whether the module at `path` is a shim: it defines nothing and only passes on names of ours.

    Its body (after the docstring) is only imports, an `__all__`, and calls of an imported `main` (bare,
    in `sys.exit(...)`, or under `if __name__ == "__main__":`), and it imports at least one module of ours.
    Two forms are a package's own and not shims: an `__init__.py` whose imports of ours all come from its own
    package (the package's face), and a `__main__.py` whose imports of ours all come from its own package (the
    package's entrypoint, `python -m pkg`). Anything else that only forwards (`old.py` re-exporting `new.py`,
    a `cli.py` calling another module's `main`) is a shim: the code belongs where its name is.
    """
    tree = ast.parse(path.read_text(), str(path))
    body = list(tree.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    mains = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name == "main"
    }
    if not body or not _only_forwards(body, mains):
        return False
    parts = path.relative_to(root).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    passed = [i.target for i in imports(name, path) if i.top in ours]
    if not passed:
        return False
    if path.name in ("__init__.py", "__main__.py"):
        own = ".".join(parts[:-1])
        return not all(t.startswith(f"{own}.") for t in passed)
    return True


def frozen_writes(path: Path) -> list[int]:
    """The lines of `path` that write around a dataclass's `__setattr__`."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "__setattr__"
            and isinstance(node.value, ast.Name)
            and node.value.id == "object"
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            value = node.value
            if (isinstance(value, ast.Attribute) and value.attr == "__dict__") or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "vars"
            ):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "update"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "__dict__"
        ):
            lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize("package", OURS)
def test_no_folder_holds_more_than_twelve_modules(package: str) -> None:
    crowded = {
        f: sorted(m) for f, m in folders(REPO_ROOT, package).items() if len(m) > MAX_MODULES_PER_FOLDER
    }
    assert crowded == {}, f"folders of over {MAX_MODULES_PER_FOLDER} modules: {crowded}"


@pytest.mark.parametrize("package", OURS)
def test_a_package_of_more_than_twelve_modules_has_rooms(package: str) -> None:
    found = folders(REPO_ROOT, package)
    total = sum(len(m) for m in found.values())
    rooms = sorted(p.parent.name for p in (REPO_ROOT / package).glob("*/__init__.py"))
    if total > MAX_MODULES_PER_FOLDER:
        assert len(rooms) >= MIN_SUB_PACKAGES, (
            f"{package}/ has {total} modules and {len(rooms)} sub-packages: {rooms}"
        )


@pytest.mark.parametrize("package", OURS)
def test_no_module_is_over_400_lines(package: str) -> None:
    long = {
        name: n
        for name, path in modules(REPO_ROOT, package).items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


@pytest.mark.parametrize("package", OURS)
def test_no_import_cycle_between_modules(package: str) -> None:
    cycle = import_cycle(REPO_ROOT, package)
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


def test_at_most_ten_fmt_skips_in_the_repository() -> None:
    skips = {f"{p.relative_to(REPO_ROOT)}:{line}" for p in python_files(REPO_ROOT) for line in fmt_skips(p)}
    assert len(skips) <= MAX_FMT_SKIPS, f"{len(skips)} `# fmt: skip`/`off` comments: {sorted(skips)}"


@pytest.mark.parametrize("package", OURS)
def test_no_shim_modules(package: str) -> None:
    shims = [p.relative_to(REPO_ROOT).as_posix() for p in modules(REPO_ROOT, package).values()]
    shims = [s for s in shims if is_shim(REPO_ROOT, REPO_ROOT / s)]
    assert shims == [], f"modules that only pass on names from elsewhere: {shims}"


@pytest.mark.parametrize("package", OURS)
def test_no_writes_into_frozen_dataclasses(package: str) -> None:
    writes = [
        f"{path.relative_to(REPO_ROOT)}:{line}"
        for path in modules(REPO_ROOT, package).values()
        for line in frozen_writes(path)
    ]
    assert writes == [], f"writes around __setattr__ (a type that changes is not frozen): {writes}"


# The checks' own tests, on small trees under tmp_path.


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


def test_cycle_check_counts_type_checking_imports(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.b\nA = 1\n",
            "pkg/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.a import A\n",
        },
    )

    assert import_cycle(tmp_path, "pkg") == ["pkg.a", "pkg.b", "pkg.a"]


def test_cycle_check_leaves_out_parent_packages_and_else_branches_count(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    import pkg.b\nA = 1\n",
            "pkg/b.py": "import json\n",
        },
    )

    assert import_cycle(tmp_path, "pkg") is None
    found = modules(tmp_path, "pkg")
    assert {resolve(i.target, found) for i in imports("pkg.a", found["pkg.a"])} == {"pkg.b", None}


def test_fmt_skip_counts_comments_not_strings(tmp_path: Path) -> None:
    _write(tmp_path, {"m.py": 'x = [1,  2]  # fmt: skip\ny = "# fmt: skip"\n# fmt: off\nz = 1\n# fmt: on\n'})

    assert fmt_skips(tmp_path / "m.py") == [1, 3]


@pytest.mark.parametrize(
    ("name", "text", "shim"),
    [
        ("pkg/old.py", "from pkg.new import f\n\n__all__ = ['f']\n", True),
        ("pkg/star.py", '"""Doc."""\nfrom other.thing import *\n', True),
        (
            "pkg/cli.py",
            "import sys\nfrom pkg.sub.cli import main\nif __name__ == '__main__':\n    sys.exit(main())\n",
            True,
        ),
        ("pkg/run.py", "from other.cli import main as run\nraise SystemExit(run())\n", True),
        ("pkg/sub/__main__.py", "from other.cli import main\nmain()\n", True),
        ("pkg/__init__.py", "from other.a import A\n", True),
        ("pkg/__main__.py", "import sys\nfrom pkg.cli import main\nsys.exit(main())\n", False),
        ("pkg/sub/__main__.py", "from pkg.sub.search import main\nmain()\n", False),
        (
            "pkg/__init__.py",
            '"""Face."""\nfrom pkg.a import A\nfrom pkg.b import B\n__all__ = ["A", "B"]\n',
            False,
        ),
        ("pkg/__init__.py", '"""Only a docstring."""\n', False),
        ("pkg/side.py", "from other.offline import disable\ndisable()\n", False),
        ("pkg/real.py", "from pkg.new import f\n\ndef g():\n    return f()\n", False),
        ("pkg/consts.py", "from other import BASE\nLIMIT = BASE * 2\n", False),
        ("pkg/stdlib.py", "import sys\n", False),
    ],
)
def test_shim_check(tmp_path: Path, name: str, text: str, shim: bool) -> None:
    _write(tmp_path, {name: text})

    assert is_shim(tmp_path, tmp_path / name, ours=("pkg", "other")) is shim


def test_frozen_write_check(tmp_path: Path) -> None:
    text = (
        "object.__setattr__(self, 'a', 1)\n"
        "self.__dict__['b'] = 2\n"
        "vars(self)['c'] = 3\n"
        "self.__dict__.update(d=4)\n"
        "x = self.__dict__['e']\n"
        "setattr(other, 'f', 5)\n"
    )
    _write(tmp_path, {"m.py": text})

    assert frozen_writes(tmp_path / "m.py") == [1, 2, 3, 4]


def test_folders_counts_each_room_apart(tmp_path: Path) -> None:
    files = {f"pkg/m{i}.py": "" for i in range(11)}
    files |= {"pkg/__init__.py": "", "pkg/room/__init__.py": "", "pkg/room/a.py": "", "pkg/notes.txt": ""}
    _write(tmp_path, files)

    found = folders(tmp_path, "pkg")

    assert {f: len(m) for f, m in found.items()} == {"pkg": 12, "pkg/room": 2}


def test_python_files_are_the_repositorys_own(tmp_path: Path) -> None:
    names = ["setup.py", "pkg/a.py", "fuzz/run.py", ".venv/lib/x.py", "build/fuzz/y.py", "bench/results/z.py"]
    _write(tmp_path, {name: "" for name in names})

    assert [p.relative_to(tmp_path).as_posix() for p in python_files(tmp_path)] == [
        "fuzz/run.py",
        "pkg/a.py",
        "setup.py",
    ]


# The tests mirror the rooms: tests/<package>/<room>/ holds the tests of <package>/<room>/, so a module's tests are
# found by its path. A test folder that is not a package of ours names the non-Python part it checks.
NOT_PACKAGES = {
    "deploy": ("docker", "k8s", "compose.yaml"),
    "deploy/containers": ("docker",),
    "scripts": ("scripts",),
}


def rooms(root: Path) -> set[str]:
    """Every package of ours and every room (sub-package) in it, as a path: `serving`, `serving/http`, ..."""
    return {
        path.parent.relative_to(root).as_posix()
        for package in OURS
        for path in (root / package).rglob("__init__.py")
        if "__pycache__" not in path.parts
    }


def folders_of_tests(root: Path) -> set[str]:
    """Every folder under tests/ that holds a file (caches left out), relative to tests/."""
    tests = root / "tests"
    return {
        p.parent.relative_to(tests).as_posix()
        for p in tests.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.parent != tests
    }


def test_every_test_folder_names_an_existing_room() -> None:
    known = rooms(REPO_ROOT)
    strays = sorted(
        f
        for f in folders_of_tests(REPO_ROOT)
        if f not in known and not all((REPO_ROOT / part).exists() for part in NOT_PACKAGES.get(f, ("-",)))
    )
    assert not strays, (
        f"test folders that name no room of ours (move their tests to tests/<package>/<room>/): {strays}"
    )


def test_every_room_has_its_test_folder() -> None:
    missing = sorted(rooms(REPO_ROOT) - folders_of_tests(REPO_ROOT))
    assert not missing, f"rooms with no tests/<package>/<room>/ folder: {missing}"


def test_no_test_outside_bench_imports_bench() -> None:
    """bench/ measures; a test of another stage checks that stage against its own code or a fixture in tests/."""
    offenders = []
    for path in python_files(REPO_ROOT / "tests"):
        rel = path.relative_to(REPO_ROOT / "tests")
        if rel.parts[0] == "bench":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{rel}: {n}" for n in names if n == "bench" or n.startswith("bench.")]
    assert not offenders, offenders


def test_mirror_checks_see_strays_and_missing_rooms(tmp_path: Path) -> None:
    _write(
        tmp_path, {"serving/__init__.py": "", "serving/http/__init__.py": "", "tests/serving/x/test_a.py": ""}
    )
    assert rooms(tmp_path) >= {"serving", "serving/http"}
    assert folders_of_tests(tmp_path) == {"serving/x"}
