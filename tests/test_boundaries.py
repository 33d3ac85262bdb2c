"""Which package may import which: the stages meet only through ctr_contract and ctr_features.

Checked on the AST of every module, every import counted: module-level, lazy (inside a function) and type-only
(under `if TYPE_CHECKING:`), since each ties the importer's code to the imported package's. The rules
(docs/design.md explains them):

- ctr_contract: the standard library only; nothing of ours.
- ctr_features: ctr_contract.        - ctr_model: ctr_contract, ctr_features.
- training, export: ctr_contract, ctr_features, ctr_model (not each other, not serving).
- serving: ctr_contract, ctr_features (no model code, no training, no export).
- pipelines: any stage; bench and tests: anything. No package imports bench or tests but bench and tests.
- pipelines.demos (the demos and the traffic simulator): imported by nothing but itself, bench and tests.

The serving image holds ctr_contract, ctr_features and serving and none of torch, lightning, pyarrow,
TensorFlow or onnx: every module serving imports, transitively among ours, must not import them at module level
(a lazy import behind a flag, like `--backend tf`, is the flag's business).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.ast_imports import OURS, Import, imports, modules, parents, resolve
from tests.helpers import REPO_ROOT

ALLOWED = {
    "ctr_contract": set(),
    "ctr_store": {"ctr_contract"},
    "ctr_features": {"ctr_contract"},
    "ctr_model": {"ctr_contract", "ctr_features"},
    "training": {"ctr_contract", "ctr_store", "ctr_features", "ctr_model"},
    "export": {"ctr_contract", "ctr_store", "ctr_features", "ctr_model"},
    "serving": {"ctr_contract", "ctr_store", "ctr_features"},
    "pipelines": {"ctr_contract", "ctr_store", "ctr_features", "ctr_model", "training", "export", "serving"},
    "bench": {*OURS, "tests"},
}
STDLIB_ONLY = ("ctr_contract",)
# What the serving image does not install (pyproject.toml's `serve` extra has none of them).
NOT_IN_SERVING_IMAGE = (
    "torch",
    "lightning",
    "pytorch_lightning",
    "pyarrow",
    "tensorflow",
    "onnx",
    "onnxscript",
)


def forbidden_imports(root: Path, package: str, allowed: dict[str, set[str]] = ALLOWED) -> list[str]:
    """`path:line imports target` for each import in `package` of one of ours that its rule does not allow."""
    ours = set(allowed) | {"tests"}
    found = []
    for name, path in modules(root, package).items():
        for i in imports(name, path):
            if i.top in ours and i.top != package and i.top not in allowed[package]:
                found.append(f"{_where(root, path, i)} imports {i.target}")
    return found


# The demos and the traffic simulator drive the product from outside; no product module imports them.
DEMOS = "pipelines.demos"


def demo_imports(root: Path, packages: tuple[str, ...] = OURS) -> list[str]:
    """`path:line imports target` for each import of DEMOS by a module of ours outside it (bench's excepted)."""
    return [
        f"{_where(root, path, i)} imports {i.target}"
        for package in packages
        if package != "bench"
        for name, path in modules(root, package).items()
        if not _within(name, DEMOS)
        for i in imports(name, path)
        if _within(i.target, DEMOS)
    ]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


# An optional extra the contract may import lazily, inside the function that needs it and guarded by ImportError:
# the stages' span per stage (ctr_contract/stage_trace.py). At import the contract stays standard library only.
OPTIONAL_LAZY = frozenset({"opentelemetry"})


def non_stdlib_imports(root: Path, package: str) -> list[str]:
    """`path:line imports target` for each import in `package` of neither the standard library nor itself
    (a lazy import of an OPTIONAL_LAZY package excepted)."""
    return [
        f"{_where(root, path, i)} imports {i.target}"
        for name, path in modules(root, package).items()
        for i in imports(name, path)
        if i.top != package
        and i.top not in sys.stdlib_module_names
        and i.top != "__future__"
        and not (i.lazy and i.top in OPTIONAL_LAZY)
    ]


def served_modules(root: Path, start: str = "serving", packages: tuple[str, ...] = OURS) -> dict[str, Path]:
    """The modules of ours that `start`'s modules import, transitively, with the packages above each one.

    Every edge counts (lazy ones too: serving may call that code) except type-only imports, which never run.
    """
    known: dict[str, Path] = {}
    for package in packages:
        known |= modules(root, package)
    todo = [n for n in known if n == start or n.startswith(f"{start}.")]
    reached: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached[name] = known[name]
        for i in imports(name, known[name]):
            if not i.type_only and (target := resolve(i.target, known)) is not None:
                todo += [*parents(target), target]
        todo += parents(name)
    return reached


def heavy_imports(
    root: Path, reached: dict[str, Path], heavy: tuple[str, ...] = NOT_IN_SERVING_IMAGE
) -> list[str]:
    """`path:line imports target` for each module-level import of a `heavy` package among `reached`."""
    return [
        f"{_where(root, path, i)} imports {i.target}"
        for name, path in sorted(reached.items())
        for i in imports(name, path)
        if i.top in heavy and not i.lazy and not i.type_only
    ]


def _where(root: Path, path: Path, i: Import) -> str:
    kind = " (type-only)" if i.type_only else " (lazy)" if i.lazy else ""
    return f"{path.relative_to(root).as_posix()}:{i.line}{kind}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_its_rule_allows(package: str) -> None:
    found = forbidden_imports(REPO_ROOT, package)
    allowed = sorted(ALLOWED[package]) or ["nothing of ours"]
    assert found == [], f"{package} may import {', '.join(allowed)}; found:\n" + "\n".join(found)


def test_no_product_module_imports_the_demos() -> None:
    found = demo_imports(REPO_ROOT)
    assert found == [], f"only {DEMOS}, bench and tests may import {DEMOS}; found:\n" + "\n".join(found)


@pytest.mark.parametrize("package", STDLIB_ONLY)
def test_the_contract_needs_only_the_standard_library(package: str) -> None:
    found = non_stdlib_imports(REPO_ROOT, package)
    assert found == [], "\n".join(found)


def test_what_serving_imports_needs_nothing_the_serving_image_lacks() -> None:
    reached = served_modules(REPO_ROOT)
    outside = sorted({n.split(".")[0] for n in reached} - {"serving", *ALLOWED["serving"]})
    assert outside == [], f"serving reaches {outside}, which the serving image does not hold"
    found = heavy_imports(REPO_ROOT, reached)
    assert found == [], "modules serving imports import at module level:\n" + "\n".join(found)


# The checks' own tests, on small trees under tmp_path.

RULES = {
    "ctr_contract": set(),
    "training": {"ctr_contract"},
    "export": {"ctr_contract"},
    "serving": {"ctr_contract"},
}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _tree(root: Path) -> None:
    _write(
        root,
        {
            "ctr_contract/__init__.py": "import json\n",
            "training/__init__.py": "",
            "training/ok.py": "from ctr_contract import names\nimport numpy\n",
            "export/__init__.py": "",
            "serving/__init__.py": "",
        },
    )


def test_boundary_check_passes_a_clean_tree(tmp_path: Path) -> None:
    _tree(tmp_path)

    assert [forbidden_imports(tmp_path, p, RULES) for p in RULES] == [[], [], [], []]
    assert non_stdlib_imports(tmp_path, "ctr_contract") == []


@pytest.mark.parametrize(
    "text",
    [
        "import export\n",
        "from export.publish import repository\n",
        "def f():\n    from export import x\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from export.gates import Gate\n",
        "import importlib\nM = importlib.import_module('export.onnx')\n",
    ],
    ids=["import", "from", "lazy", "type-only", "import_module"],
)
def test_boundary_check_fails_when_training_imports_export(tmp_path: Path, text: str) -> None:
    _tree(tmp_path)
    _write(tmp_path, {"training/x.py": text})

    found = forbidden_imports(tmp_path, "training", RULES)

    assert len(found) == 1 and found[0].startswith("training/x.py:") and " imports export" in found[0], found


def test_boundary_check_fails_when_the_contract_imports_a_third_party_package(tmp_path: Path) -> None:
    _tree(tmp_path)
    _write(tmp_path, {"ctr_contract/x.py": "def f():\n    import numpy\n"})

    assert non_stdlib_imports(tmp_path, "ctr_contract") == ["ctr_contract/x.py:2 (lazy) imports numpy"]


def test_serving_image_check_follows_imports_and_parent_packages(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "serving/__init__.py": "",
            "serving/app.py": "from ctr_features.compiled import table\ndef tf():\n    import tensorflow\n",
            "ctr_features/__init__.py": "import numpy\n",
            "ctr_features/compiled/__init__.py": "import pyarrow\n",
            "ctr_features/compiled/table.py": "from ctr_features import spec\n",
            "ctr_features/spec.py": "import torch\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ctr_features.fit\n",
            "ctr_features/fit.py": "import torch\n",
            "ctr_features/other.py": "import torch\n",
        },
    )

    reached = served_modules(tmp_path, packages=("serving", "ctr_features"))

    assert sorted(reached) == [
        "ctr_features",
        "ctr_features.compiled",
        "ctr_features.compiled.table",
        "ctr_features.spec",
        "serving",
        "serving.app",
    ]
    assert heavy_imports(tmp_path, reached) == [
        "ctr_features/compiled/__init__.py:1 imports pyarrow",
        "ctr_features/spec.py:1 imports torch",
    ]


def test_demo_check_flags_product_imports_of_the_demos_only(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pipelines/__init__.py": "",
            "pipelines/demos/__init__.py": "",
            "pipelines/demos/simulate.py": "from pipelines.online import loop\n",
            "pipelines/demos/online.py": "from pipelines.demos.simulate import instances\n",
            "pipelines/online/__init__.py": "",
            "pipelines/online/loop.py": "from pipelines.demos import simulate\n",
            "pipelines/online/step.py": "def f():\n    from ..demos.simulate import instances\n",
            "pipelines/online/metrics.py": "from pipelines import durable\n",
            "bench/__init__.py": "import pipelines.demos.online\n",
        },
    )

    assert demo_imports(tmp_path, ("pipelines", "bench")) == [
        "pipelines/online/loop.py:1 imports pipelines.demos.simulate",
        "pipelines/online/step.py:2 (lazy) imports pipelines.demos.simulate.instances",
    ]
