"""Traffic split by version label: the `# ctr-traffic:` line of a model config file, and the split rule.

The server (serving/routing/router.py) and the rollout controller (pipelines/rollout/config_file.py) must
agree on both, so they live here, in the contract, and neither imports the other's code for them.

The labels `stable`, `canary` and `shadow` are ordinary TF Serving `version_labels`. A predict that names no
version and no label goes to the `stable` label's version when the model has one and it is loaded, else to the
latest loaded version; `canary_percent` of them go to the `canary` label's version instead (when it is loaded),
and `shadow_percent` of them are also scored by the `shadow` label's version, off the client's path. A request
that names a version (`/versions/N`) or a label (`/labels/L`) is never split and never shadowed.

The shares are a comment line of the model config file, so stock TF Serving reads the same file, and its labels
mean the same there:

    # ctr-traffic: model=ctr canary_percent=10 shadow_percent=10

One line per model, anywhere in the file; each share optional (0 when absent), a number in [0, 100]. A model
without a line takes `--canary_percent` and `--shadow_percent`. `format_traffic` writes such a line and
`with_traffic` puts it into a config text (the rollout controller edits the file with them).

The split hashes the request id the client sent (`x-request-id`, gRPC metadata): a request is canary traffic
when `mix32(zlib.crc32(b"canary:" + id)) < p / 100 * 2**32`, shadowed when `mix32(zlib.crc32(b"shadow:" + id))`
is, so a retried request gets the same version, on every replica. `mix32` is MurmurHash3's 32-bit finaliser:
crc32 alone is linear, so ids that count up (`req-1`, `req-2`, ...) fall into a 10 % bucket unevenly (6.5 % to
13.3 % by thousand), and the finaliser spreads them as random ids are. A request without a client id (the
caller passes None; the server passes None for an id it made itself) gets a random choice.
"""

from __future__ import annotations

import math
import random
import re
import zlib
from dataclasses import dataclass

DIRECTIVE = "ctr-traffic:"
SHARES = ("canary_percent", "shadow_percent")
_LINE = re.compile(r"^[ \t]*#[ \t]*ctr-traffic:(.*)$", re.MULTILINE)
_UNIT = 2**32 / 100  # hash values per percent
_CANARY, _SHADOW = zlib.crc32(b"canary:"), zlib.crc32(b"shadow:")


class TrafficError(ValueError):
    """A `ctr-traffic` line that does not parse, or a share outside [0, 100]."""


def check_percent(name: str, value: float) -> float:
    """`value` when it is a number in [0, 100]; TrafficError naming `name` otherwise."""
    if not (isinstance(value, int | float) and math.isfinite(value) and 0 <= value <= 100):
        raise TrafficError(f"{name} {value!r} is outside [0, 100]")
    return float(value)


def mix32(h: int) -> int:
    """MurmurHash3's fmix32: every input bit moves every output bit (crc32 alone keeps near ids near)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def salted_share(salt: bytes, key: str, fraction: float) -> bool:
    """Whether `key` is in the `fraction` (0 to 1) of ids drawn under `salt`: mix32(crc32(salt + key)), deterministic
    in the key. The finaliser makes draws under different salts independent of each other and of plain
    crc32(key), the request log's sample (serving/observability/request_log.py): crc32 is affine, so
    crc32(salt + key) of the keys of one length is crc32(key) XOR a constant, and a sample of small crc32(key)
    would all fall on one side of an unmixed salted draw."""
    return mix32(zlib.crc32(key.encode(), zlib.crc32(salt))) < fraction * 2**32


def _drawn(seed: int, request_id: str | None, percent: float) -> bool:
    """`in_share` with the salt's crc32 as `seed`: crc32(id, crc32(salt)) is crc32(salt + id), without the copy."""
    if percent <= 0:
        return False
    if percent >= 100:
        return True
    if request_id is None:
        return random.random() * 100 < percent
    return mix32(zlib.crc32(request_id.encode(), seed)) < percent * _UNIT


@dataclass(frozen=True)
class TrafficSplit:
    """One model's shares of its unlabelled requests, in percent."""

    canary_percent: float = 0.0
    shadow_percent: float = 0.0

    def __post_init__(self) -> None:
        for name in SHARES:
            check_percent(name, getattr(self, name))

    @property
    def active(self) -> bool:
        """Whether any request is split or shadowed (the request id is then needed)."""
        return self.canary_percent > 0 or self.shadow_percent > 0

    def canary(self, request_id: str | None) -> bool:
        """Whether this unlabelled request goes to the `canary` label's version (`request_id` None: the client
        sent none, a random choice)."""
        return _drawn(_CANARY, request_id, self.canary_percent)

    def shadow(self, request_id: str | None) -> bool:
        """Whether this unlabelled request is also scored by the `shadow` label's version."""
        return _drawn(_SHADOW, request_id, self.shadow_percent)


def parse_traffic(text: str, source: str = "--model_config_file") -> dict[str, TrafficSplit]:
    """Every `# ctr-traffic:` line of a config text: model name -> split; TrafficError naming the line."""
    splits: dict[str, TrafficSplit] = {}
    for match in _LINE.finditer(text):
        where = f"{source} line {text.count(chr(10), 0, match.start()) + 1}"
        model, shares = None, {}
        for item in match.group(1).split():
            key, sep, value = item.partition("=")
            if key == "model" and sep and value:
                model = value
            elif key in SHARES and sep:
                try:
                    shares[key] = check_percent(key, float(value))
                except ValueError as exc:
                    raise TrafficError(f"{where}: {key} {value!r} must be a number in [0, 100]") from exc
            else:
                raise TrafficError(
                    f"{where}: {item!r} is not model=NAME, canary_percent=P or shadow_percent=P"
                )
        if model is None:
            raise TrafficError(f"{where}: a {DIRECTIVE} line needs model=NAME")
        if model in splits:
            raise TrafficError(f"{where}: a second {DIRECTIVE} line for model {model}")
        splits[model] = TrafficSplit(**shares)
    return splits


def format_traffic(model: str, canary_percent: float = 0.0, shadow_percent: float = 0.0) -> str:
    """The `# ctr-traffic:` line (no newline) that gives `model` these shares."""
    if not model or any(c.isspace() for c in model) or "=" in model:
        raise TrafficError(f"model name {model!r} cannot be written in a {DIRECTIVE} line")
    split = TrafficSplit(canary_percent, shadow_percent)
    return (
        f"# {DIRECTIVE} model={model} canary_percent={split.canary_percent:g} "
        f"shadow_percent={split.shadow_percent:g}"
    )


def with_traffic(text: str, model: str, canary_percent: float = 0.0, shadow_percent: float = 0.0) -> str:
    """`text` with `model`'s `# ctr-traffic:` line replaced by one with these shares (put first if it had none)."""
    line = format_traffic(model, canary_percent, shadow_percent)
    kept = [old for old in text.splitlines() if _model_of(old) != model]
    return "\n".join([line, *kept]) + "\n"


def _model_of(line: str) -> str | None:
    """The model a `# ctr-traffic:` line names; None for any other line."""
    match = _LINE.match(line)
    items = match.group(1).split() if match is not None else []
    return next((item[len("model=") :] for item in items if item.startswith("model=")), None)
