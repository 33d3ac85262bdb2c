"""serving/'s rooms import one way, from the entry down to the leaf types, type-only and lazy imports counted.

A request walks forward through them: app (start-up) -> protocols (the wire APIs and the one REST router) ->
dataplane (the protocol-free predict path) -> routing (which version answers) -> runtime (running a version).
routing/ and repository/ (versions on disk: scan, check, load, unload) sit on one level and never import each
other: the repository pushes its versions to the router through a protocol of its own (VersionWatcher), and
the predict path and the app are the only rooms that know both. http/ is the HTTP/1.1 layer under app and
protocols; codecs/ (wire formats) and observability/ serve the
rooms above them, protos/ (descriptor sets) the codecs; the top-level leaf types (errors.py, signatures.py,
requests.py) sit below everything. A module may import its own room and rooms below it, never one above or
beside it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ast_imports import imports, modules, resolve
from tests.helpers import REPO_ROOT

LEAF = "<leaf types>"
LEVELS = {
    "__main__": 0,
    "app": 1,
    "protocols": 2,
    "http": 3,
    "dataplane": 3,
    "repository": 4,
    "routing": 4,
    "runtime": 5,
    "codecs": 6,
    "observability": 6,
    "protos": 7,
    LEAF: 8,
}


def room(module: str, root: Path) -> str:
    """The room of a serving module: its sub-package, `__main__`, or LEAF for a top-level module."""
    part = module.split(".")[1]
    return part if part == "__main__" or (root / "serving" / part).is_dir() else LEAF


def backward_imports(root: Path) -> list[str]:
    """`module:line imports target` for every import that climbs a level or crosses sideways between rooms."""
    found = modules(root, "serving")
    wrong = []
    for name, path in found.items():
        if name == "serving":  # the package's __init__ runs before every room
            continue
        here = room(name, root)
        for imp in imports(name, path):
            target = resolve(imp.target, found)
            if target is None or target == "serving":
                continue
            there = room(target, root)
            if there != here and LEVELS[there] <= LEVELS[here]:
                wrong.append(f"{name}:{imp.line} ({here}) imports {target} ({there})")
    return wrong


def test_every_room_has_a_level() -> None:
    rooms = {p.parent.name for p in (REPO_ROOT / "serving").glob("*/__init__.py")}
    assert rooms | {"__main__", LEAF} == set(LEVELS)


def test_rooms_import_only_rooms_below_them() -> None:
    assert backward_imports(REPO_ROOT) == []


@pytest.mark.parametrize(
    ("importer", "text", "backward"),
    [
        ("runtime/batcher.py", "from serving.protocols.router import RestRouter\n", True),
        (
            "runtime/batcher.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import serving.app.x\n",
            True,
        ),
        ("dataplane/x.py", "from serving.http.messages import require_method\n", True),
        ("protocols/x.py", "from serving.dataplane.validation import parse_version\n", False),
        ("routing/x.py", "from serving.repository.manager import ModelManager\n", True),
        ("repository/x.py", "from serving.routing.router import Router\n", True),
        ("dataplane/x.py", "from serving.routing.router import Router\n", False),
        ("errors.py", "def f():\n    from serving.codecs import tensors\n", True),
    ],
)
def test_backward_import_check(tmp_path: Path, importer: str, text: str, backward: bool) -> None:
    for module in ("app/x.py", "protocols/router.py", "http/messages.py", "dataplane/validation.py"):
        (tmp_path / "serving" / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "serving" / module).write_text("")
    for module in ("repository/manager.py", "routing/router.py"):
        (tmp_path / "serving" / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "serving" / module).write_text("")
    for folder in ("app", "protocols", "http", "dataplane", "runtime", "codecs", "repository", "routing"):
        (tmp_path / "serving" / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / "serving" / folder / "__init__.py").write_text("")
    (tmp_path / "serving" / "__init__.py").write_text("")
    (tmp_path / "serving" / "codecs" / "tensors.py").write_text("")
    (tmp_path / "serving" / importer).write_text(text)
    assert bool(backward_imports(tmp_path)) is backward
