"""Flags of `python -m serving` beside serving/app/config.py: their argparse types (gflags-style booleans,
version labels, version policies, shares), the REST connection limits and the traffic split by label."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ctr_contract.repository import parse_version_dir
from ctr_contract.traffic import TrafficError, check_percent
from serving.http.shared import COMPRESS_MIN_BYTES
from serving.repository.bucket import BasePath, parse_base_path
from serving.repository.policy import VersionPolicy

DEFAULT_CACHE_DIR = Path(tempfile.gettempdir()) / "ctr-model-cache"


def bool_flag(text: str) -> bool:
    """gflags-style booleans: `--enable_batching`, `--enable_batching=true`, `--enable_batching=false`."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def labels_flag(text: str) -> dict[str, int]:
    """`stable=1,canary=2` -> {"stable": 1, "canary": 2}."""
    labels = {}
    for pair in filter(None, text.split(",")):
        name, _, version = pair.partition("=")
        number = parse_version_dir(version)  # a label names a version folder: the same rule
        if not name or number is None:
            raise argparse.ArgumentTypeError(f"expected LABEL=VERSION pairs such as stable=1, got {pair!r}")
        labels[name] = number
    return labels


def base_path_flag(text: str) -> BasePath:
    """A folder, or `s3://BUCKET/PREFIX` (serving/repository/bucket.py)."""
    try:
        return parse_base_path(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_store_flags(group: argparse._ArgumentGroup) -> None:
    """Base paths in a bucket: the cache of their versions, and a version's download deadline."""
    group.add_argument(
        "--model_cache_dir",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        help="where versions of an s3:// base path are downloaded, in <dir>/<model name>/<version>/; kept "
        "across restarts, holding the versions the policy serves; workers share it",
    )
    group.add_argument(
        "--model_download_timeout_seconds",
        type=float,
        default=600.0,
        help="a version of an s3:// base path not downloaded within this fails the poll, retried at the "
        "next; 0 = no limit",
    )


def policy_flag(text: str) -> VersionPolicy:
    try:
        return VersionPolicy.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def percent(text: str) -> float:
    """A share in percent: a number in [0, 100]."""
    try:
        return check_percent("the share", float(text))
    except (TrafficError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"expected a percent in [0, 100], got {text!r}") from exc


def add_http_flags(p: argparse.ArgumentParser) -> None:
    """The REST connection limits (serving/http/shared.py HttpLimits) and response compression."""
    http = p.add_argument_group("REST connection limits (against slow and hostile clients)")
    http.add_argument(
        "--header_timeout_seconds",
        type=float,
        default=10.0,
        help="time from a request's first byte (or the connect) to the end of its headers",
    )
    http.add_argument(
        "--body_timeout_seconds",
        type=float,
        default=30.0,
        help="time to receive a body after its headers; also how long output may stay unread",
    )
    http.add_argument(
        "--keepalive_timeout_seconds",
        type=float,
        default=75.0,
        help="idle time between requests before a connection is closed",
    )
    http.add_argument(
        "--max_header_bytes", type=int, default=64 << 10, help="request line + headers over this get 431"
    )
    http.add_argument("--max_headers", type=int, default=200, help="more header lines get 431")
    http.add_argument(
        "--max_connections",
        type=int,
        default=1024,
        help="open REST connections per worker; more are answered 503 and closed",
    )
    http.add_argument(
        "--max_output_bytes",
        type=int,
        default=1 << 20,
        help="unsent response bytes per connection before it stops being read",
    )
    http.add_argument(
        "--max_buffered_bytes",
        type=int,
        default=64 << 20,
        help="request body bytes held by all connections of a worker; larger bodies past it get 503",
    )
    http.add_argument(
        "--response_compression_min_bytes",
        type=int,
        default=COMPRESS_MIN_BYTES,
        help="REST responses larger than this are compressed (gzip, else deflate) for a client whose "
        "Accept-Encoding takes it; 0 compresses every non-empty response (measured: "
        "docs/perf/serving-compression.md)",
    )


def add_traffic_flags(p: argparse.ArgumentParser) -> None:
    """The shares of a model's unlabelled requests (ctr_contract/traffic.py) with no ctr-traffic line."""
    split = p.add_argument_group("traffic split by label (docs/serving-versions.md)")
    for share, what in (
        ("canary", "go to the canary label's version"),
        ("shadow", "are also scored by the shadow label's version"),
    ):
        split.add_argument(
            f"--{share}_percent",
            type=percent,
            default=0.0,
            help=f"percent of unlabelled predicts that {what}, by a hash of the client's x-request-id; "
            "a model's '# ctr-traffic:' line in --model_config_file overrides it",
        )


def add_watch_flags(p: argparse.ArgumentParser) -> None:
    """What watches the answered requests: drift, the sampled request log, Triton's statistics."""
    watch = p.add_argument_group("drift metrics, request logs and statistics (docs/daily-loop.md)")
    watch.add_argument(
        "--drift_window",
        type=int,
        default=10_000,
        help="recent rows the drift PSI gauges cover, over all workers; 0 = off",
    )
    watch.add_argument(
        "--request_log_dir",
        type=Path,
        default=None,
        help="write sampled requests and responses here as JSON lines (default: none, no request log)",
    )
    watch.add_argument(
        "--request_log_sample_rate",
        type=float,
        default=0.0,
        help="share of requests logged, by a hash of the request id; 0 = off",
    )
    watch.add_argument(
        "--request_log_max_bytes",
        type=int,
        default=64 << 20,
        help="start a new request log file once one holds this many bytes",
    )
    watch.add_argument(
        "--model_statistics",
        type=bool_flag,
        nargs="?",
        const=True,
        default=True,
        help="keep Triton's statistics of every predict (v2 .../stats, gRPC ModelStatistics); false: nothing "
        "is counted on the request path and those calls answer that statistics are off",
    )
