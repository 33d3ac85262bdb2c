"""The model config file the controller acts through: TF Serving's ModelServerConfig text, plus the traffic line.

The controller owns three things of its model's `config { ... }` entry: the `stable`, `canary` and `shadow`
version labels, the `specific { versions }` policy (the versions it needs loaded), and the model's
`# ctr-traffic: model=ctr canary_percent=P shadow_percent=S` line (a comment, so stock TF Serving reads the
same labels; written and read back with ctr_contract/traffic.py). Other models' entries and traffic lines, and the model's other labels that still name a listed
version, are kept. Comment lines are kept too, gathered at the top of the file (protobuf's text writer keeps
no comments inside an entry).

Each write is checked first (the server's own parser reads it back, the labels name listed versions on disk,
the shares lie in [0, 100]), then replaces the file atomically: a temporary beside it, fsync, rename, fsync
the folder. Writing the same target twice leaves the same bytes, so a restart may repeat a write safely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from ctr_contract.traffic import TrafficError, TrafficSplit, format_traffic, parse_traffic
from pipelines.durable import replace_file
from pipelines.rollout.versions import Versions
from serving import protos
from serving.repository.model_config import ModelConfigError, ModelSpec, labels_off_disk, parse_model_config

MANAGED_LABELS = ("stable", "canary", "shadow")
DIRECTIVE = re.compile(r"^\s*#\s*ctr-traffic:(.*)$")


class ConfigFileError(ValueError):
    """The config file cannot be read, lacks the model, or a target would make it one the server refuses."""


@dataclass(frozen=True)
class Target:
    """What the controller wants the server to do for its model."""

    versions: tuple[int, ...]  # the `specific` policy: loaded versions
    labels: dict[str, int] = field(default_factory=dict)  # stable / canary / shadow -> version
    canary_percent: float = 0.0
    shadow_percent: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "versions": list(self.versions),
            "labels": dict(sorted(self.labels.items())),
            "canary_percent": self.canary_percent,
            "shadow_percent": self.shadow_percent,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Target:
        return Target(
            tuple(int(v) for v in d["versions"]),
            {str(k): int(v) for k, v in d["labels"].items()},
            float(d["canary_percent"]),
            float(d["shadow_percent"]),
        )


def _names(line: str, model: str) -> bool:
    """Whether `line` is a traffic line of `model` (well formed or not)."""
    match = DIRECTIVE.match(line)
    return match is not None and f"model={model}" in match.group(1).split()


def traffic_of(text: str, model: str) -> TrafficSplit | None:
    """The split the file's traffic lines give `model`, as the server reads them (None: no line for it)."""
    try:
        return parse_traffic(text).get(model)
    except TrafficError as exc:
        raise ConfigFileError(str(exc)) from exc


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"cannot read the model config file {path}: {exc}") from exc


def model_spec(text: str, model: str, source: str) -> ModelSpec:
    """The model's entry as the server parses it."""
    try:
        specs = {s.name: s for s in parse_model_config(text, source)}
    except ModelConfigError as exc:
        raise ConfigFileError(str(exc)) from exc
    if model not in specs:
        raise ConfigFileError(f"{source} has no config {{ name: {model!r} }}; add the model's entry first")
    return specs[model]


def render(text: str, model: str, target: Target) -> str:
    """`text` with the model's versions, managed labels and traffic line set to `target`."""
    message = protos.message_class("tensorflow.serving.ModelServerConfig")()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ConfigFileError(f"the model config file is not ModelServerConfig text: {exc}") from exc
    entries = [c for c in message.model_config_list.config if c.name == model]
    if not entries:
        raise ConfigFileError(f"the model config file has no config {{ name: {model!r} }}")
    entry = entries[0]
    entry.model_version_policy.specific.ClearField("versions")
    entry.model_version_policy.specific.versions.extend(sorted(target.versions))
    for key in list(entry.version_labels):
        if key in MANAGED_LABELS or entry.version_labels[key] not in target.versions:
            del entry.version_labels[key]
    for key, version in target.labels.items():
        entry.version_labels[key] = version
    comments = [
        line.rstrip()
        for line in text.splitlines()
        if line.strip().startswith("#") and not _names(line, model)
    ]
    try:
        comments.append(format_traffic(model, target.canary_percent, target.shadow_percent))
    except TrafficError as exc:
        raise ConfigFileError(str(exc)) from exc
    return "\n".join(comments) + "\n" + text_format.MessageToString(message)


def check(text: str, model: str, target: Target, source: str) -> None:
    """Refuse a rendered file the server would refuse, or one that does not say what `target` says."""
    for key in ("canary_percent", "shadow_percent"):
        share = getattr(target, key)
        if not 0 <= share <= 100:
            raise ConfigFileError(f"{key} {share} is outside [0, 100]")
    spec = model_spec(text, model, source)
    off_disk = labels_off_disk([spec])  # the server's own check at each re-read
    if off_disk:
        raise ConfigFileError(off_disk)
    on_disk = Versions(spec.base_path).numbers  # a bucket's: one LIST
    missing = sorted(set(target.versions) - on_disk)
    if missing:
        raise ConfigFileError(f"versions {missing} of {model} are not on disk under {spec.base_path}")
    if "stable" not in target.labels:
        raise ConfigFileError("a target without a stable label")
    for label, version in target.labels.items():
        if version not in target.versions:
            raise ConfigFileError(f"label {label} names version {version}, which is not listed")
    if spec.policy.versions != tuple(sorted(target.versions)):
        raise ConfigFileError(f"the written policy lists {spec.policy.versions}, not {target.versions}")
    if {k: spec.labels.get(k) for k in target.labels} != target.labels:
        raise ConfigFileError(f"the written labels {spec.labels} differ from {target.labels}")
    if traffic_of(text, model) != TrafficSplit(target.canary_percent, target.shadow_percent):
        raise ConfigFileError(f"the written traffic line of {model} differs from {target}")


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text` (temporary, fsync, rename, fsync of the folder); keeps the file's mode."""
    replace_file(path, text)


def apply(path: Path, model: str, target: Target) -> bool:
    """Make the file say `target` for `model`; False when it already did (nothing written)."""
    text = read_text(path)
    new = render(text, model, target)
    check(new, model, target, f"the model config {path} as the controller would write it")
    if new == text:
        return False
    write_atomic(path, new)
    return True
