"""Read a Dockerfile's instructions: enough to run its ENTRYPOINT with its ENV on the host."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    """One instruction, continuation lines joined; `stage` counts FROM lines (0 = first stage)."""

    keyword: str
    args: str
    stage: int


def instructions(path: Path) -> list[Instruction]:
    """Parse every instruction of a Dockerfile (comments and blank lines dropped)."""
    result: list[Instruction] = []
    pending = ""
    stage = -1
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # a comment inside a continued instruction does not end it either
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        pending = ""
        if keyword.upper() == "FROM":
            stage += 1
        result.append(Instruction(keyword.upper(), args.strip(), stage))
    if pending:
        raise ValueError(f"{path}: the last instruction ends with a line continuation")
    return result


def final_stage(path: Path) -> list[Instruction]:
    """The instructions of the last build stage, the one the image runs."""
    found = instructions(path)
    last = max(i.stage for i in found)
    return [i for i in found if i.stage == last]


def exec_form(args: str) -> list[str]:
    """The argv of an exec-form (JSON array) instruction; shell form raises ValueError."""
    try:
        argv = json.loads(args)
    except json.JSONDecodeError as exc:
        raise ValueError(f"expected an exec-form JSON array, got {args!r}") from exc
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"expected a JSON array of strings, got {args!r}")
    return argv


def single(stage: list[Instruction], keyword: str) -> Instruction:
    """The one instruction with this keyword in the stage (ValueError if absent or repeated)."""
    found = [i for i in stage if i.keyword == keyword]
    if len(found) != 1:
        raise ValueError(f"expected exactly one {keyword}, found {len(found)}")
    return found[0]


def env(stage: list[Instruction]) -> dict[str, str]:
    """ENV of the stage, in order, values unexpanded (e.g. `PATH=/opt/venv/bin:$PATH`)."""
    values: dict[str, str] = {}
    for ins in stage:
        if ins.keyword != "ENV":
            continue
        words = shlex.split(ins.args)
        if "=" not in words[0]:  # legacy `ENV KEY value with spaces`
            values[words[0]] = " ".join(words[1:])
            continue
        for word in words:
            key, sep, value = word.partition("=")
            if not sep:
                raise ValueError(f"expected KEY=VALUE in ENV, got {word!r}")
            values[key] = value
    return values


def healthcheck(stage: list[Instruction]) -> tuple[dict[str, str], list[str]]:
    """HEALTHCHECK options (e.g. {"--interval": "10s"}) and its exec-form CMD argv."""
    options, sep, command = single(stage, "HEALTHCHECK").args.partition("CMD ")
    if not sep:
        raise ValueError("expected HEALTHCHECK [OPTIONS] CMD [...]")
    parsed = dict(word.split("=", 1) for word in options.split())
    return parsed, exec_form(command.strip())
