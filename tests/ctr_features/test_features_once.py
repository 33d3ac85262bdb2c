"""Each part of the feature definition is written once: the schema version, the layout's constants, the FNV-1a
hash and its constants live in ctr_features/ (spec.py, layout.py, hashing.py) and everything else imports them.

The C sources do not hash values (the served table hands them each value's column, computed by the Python
hash), so there is no C hash to compare with the Python one; the scan below fails if one appears, and then a
test that it equals `fnv1a_32` belongs here.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.table import RawTransform
from ctr_features.hashing import FNV_OFFSET, FNV_PRIME, encode_strings, fnv1a_32, fnv1a_column
from ctr_features.layout import HASH_START, LIFT_START, N_CAT, N_NUM
from tests.ast_imports import OURS
from tests.ctr_features.test_features_parity import fit_small_spec
from tests.helpers import REPO_ROOT

# Where each name is defined (assigned at module level, or a def); nowhere else in Python.
HOMES = {
    "SPEC_VERSION": "ctr_features/spec.py",
    "HASH_START": "ctr_features/layout.py",
    "LIFT_START": "ctr_features/layout.py",
    "N_NUM": "ctr_features/layout.py",
    "N_CAT": "ctr_features/layout.py",
    "FNV_OFFSET": "ctr_features/hashing.py",
    "FNV_PRIME": "ctr_features/hashing.py",
    "fnv1a_32": "ctr_features/hashing.py",
}
# The FNV-1a 32-bit offset basis and prime, in hex or decimal.
FNV_LITERAL = re.compile(r"0x0*811c9dc5|0x0*1000193\b|2166136261|16777619", re.IGNORECASE)
SOURCE_DIRS = OURS


def sources(*suffixes: str) -> list[Path]:
    found = [p for d in SOURCE_DIRS for s in suffixes for p in (REPO_ROOT / d).rglob(f"*{s}")]
    return sorted(p for p in found if "results" not in p.relative_to(REPO_ROOT).parts)


def definitions(path: Path) -> set[str]:
    """Names a module assigns at its top level or defines as functions anywhere."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Name):
                    names.add(t.id)
    names |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    return names


def test_each_constant_and_the_hash_are_defined_in_one_module() -> None:
    where: dict[str, list[str]] = {name: [] for name in HOMES}
    for path in [*sources(".py"), REPO_ROOT / "setup.py"]:
        for name in definitions(path) & HOMES.keys():
            where[name].append(str(path.relative_to(REPO_ROOT)))
    assert where == {name: [home] for name, home in HOMES.items()}


def test_the_fnv_constants_appear_only_in_the_python_hash() -> None:
    found = [
        str(p.relative_to(REPO_ROOT))
        for p in sources(".py", ".c", ".h", ".pyx")
        if FNV_LITERAL.search(p.read_text())
    ]
    assert found == ["ctr_features/hashing.py"]
    assert (FNV_OFFSET, FNV_PRIME) == (0x811C9DC5, 0x01000193)


def test_the_hash_matches_published_vectors_and_its_vectorised_form() -> None:
    assert fnv1a_32("") == 0x811C9DC5 and fnv1a_32("a") == 0xE40C292C and fnv1a_32("foobar") == 0xBF9CF968
    values = ["68fd1e64", "", "héllo", "日本語", "a" * 300]
    assert fnv1a_column(encode_strings(values), prefix="C3:").tolist() == [
        fnv1a_32("C3:" + v) for v in values
    ]


def test_the_served_table_puts_vocabulary_values_in_the_specs_buckets() -> None:
    spec = fit_small_spec()
    table = RawTransform(spec.to_dict())
    for j, field_table in enumerate(spec.tables):
        value, bucket = field_table.vocab[0].decode(), int(field_table.bucket[0])
        categorical = np.full((1, N_CAT), "", dtype=object)
        categorical[0, j] = value
        row = table(RawBatch.from_rows(np.full((1, N_NUM), np.nan), categorical))[0]
        assert (
            row[HASH_START + bucket] >= 1.0
            and row[HASH_START + fnv1a_32(f"C{j + 1}:{value}") % spec.buckets] >= 1
        )
    assert (LIFT_START, HASH_START) == (2 * N_NUM, 2 * N_NUM + N_CAT) == (26, 52)


def test_the_modules_serving_imports_load_no_heavy_library_and_no_stage() -> None:
    code = (
        "import sys\n"
        "import ctr_features.compiled.table, ctr_features.compiled.few_rows, ctr_features.compiled.value_table\n"
        "import ctr_features.compiled.raw_batch, ctr_features.spec, ctr_features.errors\n"
        "heavy = ('torch', 'pyarrow', 'onnx', 'onnxruntime', 'tensorflow', 'training', 'export', 'serving')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"
