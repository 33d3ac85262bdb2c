"""Which flags a `python -m MODULE` entrypoint accepts, and the module calls inside a command line."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import REPO_ROOT

_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")


@functools.cache
def accepted_flags(module: str) -> frozenset[str]:
    """The long options `python -m MODULE --help` documents (argparse lists every one)."""
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180
    )
    if proc.returncode != 0:
        raise AssertionError(f"`python -m {module} --help` exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return frozenset(_FLAG.findall(proc.stdout))


def flags(tokens: list[str]) -> list[str]:
    """The long option names in an argv (`--out=DIR` and `--out DIR` both give `--out`)."""
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


def module_calls(argv: list[str]) -> list[tuple[str, list[str]]]:
    """Each `-m MODULE ARGS...` in an argv (python or torchrun), with the arguments that follow it."""
    calls = []
    for i, token in enumerate(argv[:-1]):
        if token == "-m":
            calls.append((argv[i + 1], argv[i + 2 :]))
    return calls


def script_module_calls(script: Path) -> list[tuple[str, list[str]]]:
    """Each `"$PYTHON" -m MODULE ...` / `python -m MODULE ...` line of a shell script."""
    calls = []
    for line in script.read_text().splitlines():
        code = line.split("#", 1)[0]
        if re.search(r"(^|\s)-m\s", code):
            calls += module_calls(code.split())
    return calls


def flag_value(argv: list[str], name: str) -> str:
    """The value of the one `NAME=VALUE` argument of `argv` (a compose command)."""
    [value] = [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]
    return value


def named_mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Container path -> (volume, read-only) of a compose service's named volumes."""
    found = {}
    for volume in service["volumes"]:
        source, target, *mode = volume.split(":")
        found[target] = (source, mode == ["ro"])
    return found
