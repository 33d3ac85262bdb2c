"""Every repository path named in docs/, the README, and our packages' docstrings and comments exists.

A path is a token that starts at one of the repository's top-level folders (`ROOTS`) and is one of:
a file (`serving/app/config.py`, `docs/design.md`: its last part has an extension), a folder written with a
trailing slash (`serving/app/`), or a whole `backticked` span (`serving/app`). Prose such as "training/serving
skew" is none of these. Left out: a token inside a longer path or a URL (`/app/serving/`, `https://x/docs/`),
globs and placeholders (`serving/protos/*.binpb`, `bench/results/<stamp>/`, `tests/<stage>/`, `RUN/`, `...`),
and what a run generates (`GENERATED`). A path is read from the repository's root, however deep the page is.

The same texts name modules: a dotted name of ours in backticks or after `python -m` (`serving.app.config`,
`ctr_features.spec.FeatureSpec`, `python -m pipelines.online`) must be a module, or a name defined at the top
of one (its first part after the module; `FeatureSpec.transform` is not followed further).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from tests.ast_imports import OURS, modules
from tests.helpers import REPO_ROOT

ROOTS = (*OURS, "tests", "docs", "docker", "k8s", "scripts", "fuzz", ".ci")
# What a run writes (gitignored): named in prose, absent from a fresh checkout.
GENERATED = ("bench/results/",)
GENERATED_SUFFIXES = (".so", ".pyc", ".egg-info")
_ROOT = "|".join(re.escape(r) for r in ROOTS)
PATH = re.compile(rf"(?<![\w./~$-])((?:{_ROOT})/[\w./-]*)")
GLOB_OR_PLACEHOLDER = set("*?[{<$%")
PLACEHOLDER_PART = re.compile(r"[A-Z][A-Z0-9_]*|\.\.\.?|N|X")
MODULE = re.compile(rf"(?:`|python -m )((?:{'|'.join(OURS)})(?:\.\w+)+)")


def named_paths(text: str) -> Iterator[tuple[int, str]]:
    """(line offset from the text's start, path) for each repository path that `text` names."""
    for match in PATH.finditer(text):
        token, after = match.group(1), text[match.end() : match.end() + 1]
        before = text[match.start() - 1 : match.start()]
        if after in GLOB_OR_PLACEHOLDER or token.endswith("..."):
            continue
        token = token.rstrip(".")
        backticked = before == "`" and after == "`"
        parts = token.rstrip("/").split("/")
        if not (token.endswith("/") or re.search(r"\.[A-Za-z0-9]+$", parts[-1]) or backticked):
            continue
        if any(PLACEHOLDER_PART.fullmatch(p) for p in parts[1:]):
            continue
        if token.startswith(GENERATED) or token.endswith(GENERATED_SUFFIXES):
            continue
        yield text.count("\n", 0, match.start()), token


def python_prose(path: Path) -> Iterator[tuple[int, str]]:
    """(first line, text) of each docstring, bare string statement and comment of the module at `path`."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source, str(path))):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield node.lineno, node.value.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def documents(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def package_modules(root: Path) -> list[Path]:
    return [
        p for package in OURS for p in sorted((root / package).rglob("*.py")) if "__pycache__" not in p.parts
    ]


def missing_paths(root: Path) -> list[str]:
    """`file:line: path` for each path named in the documents or the packages' prose that does not exist."""
    missing = []
    for doc in documents(root):
        for offset, token in named_paths(doc.read_text()):
            if not (root / token).exists():
                missing.append(f"{doc.relative_to(root).as_posix()}:{offset + 1}: {token}")
    for module in package_modules(root):
        for line, text in python_prose(module):
            for offset, token in named_paths(text):
                if not (root / token).exists():
                    missing.append(f"{module.relative_to(root).as_posix()}:{line + offset}: {token}")
    return missing


def top_level_names(path: Path) -> set[str]:
    """The names a module binds at its top level (also inside a top-level `if` or `try`)."""
    found = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        scope = ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]
        for inner in scope:
            if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.add(inner.name)
            elif isinstance(inner, ast.Import | ast.ImportFrom):
                found |= {(a.asname or a.name).split(".")[0] for a in inner.names}
            elif isinstance(inner, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                found |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return found


def named_modules(text: str) -> Iterator[tuple[int, str]]:
    """(line offset from the text's start, dotted name) for each module name of ours that `text` names."""
    for match in MODULE.finditer(text):
        yield text.count("\n", 0, match.start()), match.group(1)


def module_exists(name: str, known: dict[str, Path]) -> bool:
    """Whether `name` is a module of `known` or a top-level name of one."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        if (module := ".".join(parts[:k])) in known:
            return k == len(parts) or parts[k] in top_level_names(known[module])
    return False


def missing_modules(root: Path) -> list[str]:
    """`file:line: name` for each module name in the documents or the packages' prose that does not exist."""
    known = {name: path for package in OURS for name, path in modules(root, package).items()}
    texts = [(doc, 1, doc.read_text()) for doc in documents(root)]
    texts += [(m, line, text) for m in package_modules(root) for line, text in python_prose(m)]
    return [
        f"{path.relative_to(root).as_posix()}:{line + offset}: {name}"
        for path, line, text in texts
        for offset, name in named_modules(text)
        if not module_exists(name, known)
    ]


def test_every_named_repository_path_exists() -> None:
    missing = missing_paths(REPO_ROOT)
    assert missing == [], f"{len(missing)} named paths do not exist:\n" + "\n".join(missing)


def test_every_named_module_exists() -> None:
    missing = missing_modules(REPO_ROOT)
    assert missing == [], f"{len(missing)} named modules do not exist:\n" + "\n".join(missing)


def test_path_pattern() -> None:
    text = (
        "See serving/app/config.py, docs/design.md. The `serving/app` room and the serving/ folder.\n"
        "training/serving skew; /app/serving/x.py; https://example.com/docs/x.md; serving/protos/*.binpb;\n"
        "bench/results/<stamp>/report.md, bench/results/, tests/<stage>/conftest.py, export/RUN/x.py,\n"
        "(tests/serving/test_x.py::test_y) ctr_features/spec.py: serving/codecs/_raw_native.so, docs/...\n"
    )

    assert list(named_paths(text)) == [
        (0, "serving/app/config.py"),
        (0, "docs/design.md"),
        (0, "serving/app"),
        (0, "serving/"),
        (3, "tests/serving/test_x.py"),
        (3, "ctr_features/spec.py"),
    ]


def test_missing_paths_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving" / "a.py").write_text(
        '"""Uses serving/a.py and\nserving/gone.py."""\n# see docs/x.md\n'
    )
    (tmp_path / "README.md").write_text("Layout: `serving/`, `docs/`\n")
    (tmp_path / "docs" / "x.md").write_text("One\ntwo: serving/b/\n")

    assert missing_paths(tmp_path) == ["docs/x.md:2: serving/b/", "serving/a.py:2: serving/gone.py"]


def test_missing_modules_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "serving" / "app").mkdir(parents=True)
    (tmp_path / "serving" / "__init__.py").write_text("")
    (tmp_path / "serving" / "app" / "__init__.py").write_text("")
    (tmp_path / "serving" / "app" / "config.py").write_text(
        '"""`serving.app.config.parse` and\n`serving.app.config.Config.width`, not `serving.app.gone`."""\n'
        "from json import loads as parse\nclass Config: ...\n"
    )
    (tmp_path / "README.md").write_text("`python -m serving` and\n`python -m serving.api` and serving.x.y\n")

    assert missing_modules(tmp_path) == [
        "README.md:2: serving.api",
        "serving/app/config.py:2: serving.app.gone",
    ]
