"""`--model_config_file`: TF Serving's ModelServerConfig text proto, read at start and re-read while serving.

The file is the one stock TF Serving reads (`model_config_list { config { ... } }`), parsed by protobuf's
text_format with the real `tensorflow.serving.ModelServerConfig` message (committed descriptor set, no TF):

    model_config_list {
      config {
        name: "ctr"
        base_path: "/models/ctr"
        model_platform: "tensorflow"        # the only platform TF Serving knows; --backend picks onnx or tf
        model_version_policy { latest { num_versions: 2 } }   # or all {} or specific { versions: 1 }
        version_labels { key: "stable" value: 1 }
      }
    }
    # ctr-traffic: model=ctr canary_percent=10 shadow_percent=0

The `# ctr-traffic:` comment gives a model's traffic split by label (ctr_contract/traffic.py); stock
TF Serving reads it as a comment.

With `--model_config_file_poll_wait_seconds N` the file is re-read every N seconds: models added to it are
loaded, models removed from it stop taking requests and are unloaded once their in-flight requests finish,
and a changed policy, labels or split apply in place. An edit that does not parse or check keeps the last good
config and logs one line (once per bad content): among the checks, a share outside [0, 100], and a label
naming a version that is not on disk, or that a `specific` policy does not list. Such an edit is checked
again at each poll and applies once the version it names is on disk.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

from ctr_contract.repository import parse_version_dir
from ctr_contract.traffic import TrafficError, TrafficSplit, parse_traffic
from ctr_store.errors import StoreError
from ctr_store.objects import ObjectStore
from ctr_store.versions import list_versions
from serving import protos
from serving.repository.bucket import BasePath, parse_base_path
from serving.repository.policy import VersionPolicy
from serving.repository.scan import scan_base

log = logging.getLogger(__name__)
PLATFORMS = ("", "tensorflow")  # what stock TF Serving accepts; the server's --backend loads the files


class ModelConfigError(ValueError):
    """The model config file is unreadable, not ModelServerConfig text, or names models wrongly."""


@dataclass(frozen=True)
class ModelSpec:
    """One `config { ... }` entry: what `--model_name`, `--model_base_path`, the policy and labels set alone."""

    name: str
    base_path: BasePath  # a folder, or s3://BUCKET/PREFIX (serving/repository/bucket.py)
    policy: VersionPolicy
    labels: dict[str, int]
    traffic: TrafficSplit | None = None  # its `# ctr-traffic:` line; None: the server's --canary_percent etc.


def _policy(config: object, where: str) -> VersionPolicy:
    policy = config.model_version_policy  # type: ignore[attr-defined]
    choice = policy.WhichOneof("policy_choice")
    if choice is None:
        return VersionPolicy("latest", 1)  # TF Serving's default
    if choice == "all":
        return VersionPolicy("all")
    if choice == "latest":
        return VersionPolicy("latest", policy.latest.num_versions or 1)
    versions = tuple(sorted(policy.specific.versions))
    if not versions or any(parse_version_dir(str(v)) is None for v in versions):
        raise ModelConfigError(f"{where}: specific {{ versions }} must list versions from 1 to 2**63-1")
    return VersionPolicy("specific", versions=versions)


def parse_model_config(text: str, source: str = "--model_config_file") -> list[ModelSpec]:
    """Parse ModelServerConfig text into one ModelSpec per model; ModelConfigError names the entry and the fix."""
    message = protos.message_class("tensorflow.serving.ModelServerConfig")()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{source} is not ModelServerConfig text format: {exc}") from exc
    if message.WhichOneof("config") != "model_config_list" or not message.model_config_list.config:
        raise ModelConfigError(
            f"{source} needs model_config_list {{ config {{ name: ... base_path: ... }} }}"
        )
    try:
        traffic = parse_traffic(text, source)
    except TrafficError as exc:
        raise ModelConfigError(str(exc)) from exc
    specs: dict[str, ModelSpec] = {}
    for i, config in enumerate(message.model_config_list.config):
        where = f"{source} config {i} ({config.name or 'no name'})"
        if not config.name or not config.base_path:
            raise ModelConfigError(f"{where}: every config needs a name and a base_path")
        if "/" in config.name or config.name in specs:
            problem = "repeats a name" if config.name in specs else "has '/' in its name"
            raise ModelConfigError(f"{where}: {problem}; model names are unique and URL-safe")
        if config.model_platform not in PLATFORMS:
            raise ModelConfigError(
                f'{where}: model_platform {config.model_platform!r} is not served; use "tensorflow" '
                "(the files are read by --backend)"
            )
        labels = dict(config.version_labels)
        bad = [f"{k}={v}" for k, v in sorted(labels.items()) if not k or parse_version_dir(str(v)) is None]
        if bad:
            raise ModelConfigError(f"{where}: version_labels {bad} must map a name to a version >= 1")
        policy = _policy(config, where)
        unlisted = [
            f"{k}={v}"
            for k, v in sorted(labels.items())
            if policy.kind == "specific" and v not in policy.versions
        ]
        if unlisted:
            raise ModelConfigError(
                f"{where}: version_labels {unlisted} name versions the specific policy {list(policy.versions)} "
                "does not serve"
            )
        try:
            base_path = parse_base_path(config.base_path)
        except ValueError as exc:
            raise ModelConfigError(f"{where}: base_path {exc}") from None
        specs[config.name] = ModelSpec(config.name, base_path, policy, labels, traffic.get(config.name))
    unknown = sorted(set(traffic) - set(specs))
    if unknown:
        raise ModelConfigError(
            f"{source}: ctr-traffic lines name models {unknown} that it does not configure"
        )
    return list(specs.values())


def labels_off_disk(specs: list[ModelSpec]) -> str:
    """What is wrong when a label names a version with no folder under its model's base path ("" if none);
    a base path in a bucket is listed (one LIST), so this blocks: call it off the event loop."""
    problems = []
    for spec in specs:
        if not spec.labels:
            continue
        versions, error = listed_versions(spec.base_path)
        missing = {k: v for k, v in sorted(spec.labels.items()) if v not in versions}
        if missing:
            where = f"no such version under {spec.base_path}" + (f" ({error})" if error else "")
            problems.append(f"model {spec.name}: version_labels {missing} name versions with {where}")
    return "; ".join(problems)


def listed_versions(base_path: BasePath) -> tuple[set[int], str | None]:
    """The versions under a base path (folders, or prefixes in a bucket), and what prevented the listing."""
    if isinstance(base_path, Path):
        scan = scan_base(base_path, set())
        return set(scan.versions), scan.base_error
    try:
        return list_versions(shared_store(), base_path), None
    except StoreError as exc:
        return set(), str(exc)


@functools.cache
def shared_store() -> ObjectStore:
    """One store client for the config file's checks (made at the first bucket base path, then kept)."""
    return ObjectStore()


def read_model_config(path: Path) -> list[ModelSpec]:
    """Read and parse the file; ModelConfigError when it cannot be read or parsed."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"cannot read --model_config_file {path}: {exc}") from exc
    return parse_model_config(text, f"--model_config_file {path}")


class ModelConfigPoller:
    """Re-reads the config file and hands each new good config to `apply`; bad edits keep the last good one."""

    def __init__(
        self, path: Path, apply: Callable[[list[ModelSpec]], Awaitable[None]], on_poll: Callable[[], None]
    ) -> None:
        self.path, self._apply, self._on_poll = path, apply, on_poll
        self._last_text: str | None = None
        self._last_error = ""

    async def poll_once(self) -> None:
        """Read the file; apply it when its content changed and it parses."""
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            self._report(f"cannot read --model_config_file {self.path}: {exc}")
            return
        if text == self._last_text:
            return
        try:
            specs = parse_model_config(text, f"--model_config_file {self.path}")
        except ModelConfigError as exc:
            self._report(str(exc))
            return
        missing = await asyncio.to_thread(labels_off_disk, specs)  # a bucket's listing blocks
        if missing:
            self._report(f"--model_config_file {self.path}: {missing}")
            return
        self._last_text, self._last_error = text, ""
        await self._apply(specs)

    def _report(self, error: str) -> None:
        if error != self._last_error:  # one line per bad edit, not one per poll
            log.error("%s; keeping the last good model config", error)
            self._last_error = error

    async def poll_forever(self, interval_s: float) -> None:
        """Poll every `interval_s` (cancel to stop); a failure to apply is logged and retried next time."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.poll_once()
            except Exception:
                log.exception("applying --model_config_file %s failed", self.path)
                self._last_text = None  # try again on the next poll
            self._on_poll()  # tests and operators see each read end
