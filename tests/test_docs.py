"""The README and docs/: a short front door, links that resolve, and commands that exist as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.deploy.module_flags import accepted_flags, flags, module_calls
from tests.helpers import REPO_ROOT

README = REPO_ROOT / "README.md"
PAGES = sorted((REPO_ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *PAGES]
# The entrypoints whose flags are checked; others (bench's sections) have their own tests.
OUTSIDE = "/".join(("..", "shared"))  # the development machine's folder beside the repository
CHECKED_MODULES = {"training", "training.synth", "export", "serving", "bench", "bench.compare"}


def _name(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


def bash_commands(text: str) -> list[tuple[str, list[str]]]:
    """(text, argv) of each command in the ```bash blocks: continuation lines and multi-line quotes joined."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        pending = ""
        for line in block.replace("\\\n", " ").splitlines():
            pending = f"{pending}\n{line}" if pending else line
            try:
                argv = shlex.split(pending, comments=True)
            except ValueError:  # a quote continues on the next line
                continue
            if argv:
                commands.append((pending.strip(), argv))
            pending = ""
        assert not pending, f"unterminated quote in a bash block: {pending[:80]}"
    return commands


def test_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    assert "```mermaid" in text
    assert re.findall(r"^make (\w+)", text, re.M)[:2] == ["run", "test"]
    for page in ("training", "export", "serving", "deploy", "bench", "design"):
        assert f"(docs/{page}.md)" in text, f"README does not link docs/{page}.md"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=_name)
def test_relative_links_resolve(doc: Path) -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
        if not re.match(r"[a-z]+://", target):
            assert (doc.parent / target).exists(), f"{_name(doc)} links {target}, which does not exist"


def test_nothing_points_outside_the_repository() -> None:
    texts = [*DOCUMENTS, *REPO_ROOT.glob("*/**/*.py")]
    offenders = [
        _name(p) for p in texts if ".venv" not in p.parts and OUTSIDE in p.read_text(errors="replace")
    ]
    assert offenders == []


@pytest.mark.parametrize("doc", DOCUMENTS, ids=_name)
def test_make_targets_exist(doc: Path) -> None:
    targets = set(re.findall(r"^([a-zA-Z_-]+):", (REPO_ROOT / "Makefile").read_text(), re.M))
    for line, argv in bash_commands(doc.read_text()):
        if "make" in argv:
            words = [w for w in argv[argv.index("make") + 1 :] if "=" not in w]
            assert words and words[0] in targets, f"{_name(doc)}: `{line}` is not a make target"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=_name)
def test_module_commands_use_flags_that_exist(doc: Path) -> None:
    for line, argv in bash_commands(doc.read_text()):
        for module, args in module_calls(argv):
            if module in CHECKED_MODULES:
                unknown = set(flags(args)) - accepted_flags(module)
                assert not unknown, (
                    f"{_name(doc)}: `{line}` uses {sorted(unknown)}, unknown to python -m {module}"
                )


def test_serving_flag_table_lists_every_server_flag() -> None:
    table = [
        line
        for line in (REPO_ROOT / "docs" / "serving.md").read_text().splitlines()
        if line.startswith("| `--")
    ]
    named = {flag for line in table for flag in re.findall(r"`(--[a-z_]+)", line.split("|")[1])}
    assert named == accepted_flags("serving") - {"--help"}  # every flag, and only flags that exist
