"""Command line: TF Serving's own flag names for what it shares, plus ours. Parsed in `main()` only."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from serving.backends import BACKENDS
from serving.version_policy import VersionPolicy


def _bool(text: str) -> bool:
    """gflags-style booleans: `--enable_batching`, `--enable_batching=true`, `--enable_batching=false`."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _labels(text: str) -> dict[str, int]:
    """`stable=1,canary=2` -> {"stable": 1, "canary": 2}."""
    labels = {}
    for pair in filter(None, text.split(",")):
        name, _, version = pair.partition("=")
        if not name or not (version.isascii() and version.isdigit()):
            raise argparse.ArgumentTypeError(f"expected LABEL=VERSION pairs such as stable=1, got {pair!r}")
        labels[name] = int(version)
    return labels


def _policy(text: str) -> VersionPolicy:
    try:
        return VersionPolicy.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


@dataclass(frozen=True)
class ServerConfig:
    """Typed settings of one server process."""

    port: int
    rest_api_port: int
    host: str
    model_name: str
    model_base_path: Path
    backend: str
    enable_batching: bool
    max_batch_size: int
    batch_timeout_micros: int
    max_enqueued_batches: int
    file_system_poll_wait_seconds: int
    rest_api_timeout_in_ms: int
    max_body_bytes: int
    max_instances: int
    allow_nonfinite: bool
    model_version_policy: VersionPolicy
    version_labels: dict[str, int]
    grace_period_seconds: float
    intra_op_threads: int
    num_workers: int
    print_curl_example: bool
    log_level: str


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m serving",
        description="TF-Serving-compatible model server (REST + gRPC) for the CTR model repository.",
    )
    tf = p.add_argument_group("TF Serving flags (same names and meaning)")
    tf.add_argument("--port", type=int, default=8500, help="gRPC port")
    tf.add_argument("--rest_api_port", type=int, default=8501, help="REST port; 0 disables REST")
    tf.add_argument("--model_name", default="default", help="name in /v1/models/NAME and ModelSpec.name")
    tf.add_argument(
        "--model_base_path", type=Path, required=True, help="folder holding numeric version folders"
    )
    tf.add_argument("--enable_batching", type=_bool, nargs="?", const=True, default=False)
    tf.add_argument("--file_system_poll_wait_seconds", type=int, default=1,
                    help="seconds between scans for new versions; 0 scans once")  # fmt: skip
    tf.add_argument(
        "--rest_api_timeout_in_ms", type=int, default=30000, help="deadline of a queued request; 0 = none"
    )
    ours = p.add_argument_group("ctr-pipeline flags")
    ours.add_argument("--host", default="0.0.0.0", help="bind address (0.0.0.0 in containers)")
    ours.add_argument(
        "--backend", choices=BACKENDS, default="onnx", help="onnx: model.onnx; tf: saved_model.pb"
    )
    ours.add_argument("--max_batch_size", type=int, default=256, help="rows per merged batch")
    ours.add_argument("--batch_timeout_micros", type=int, default=0,
                      help="longest a batch waits for more rows; 0 = take what is queued when the model is free")  # fmt: skip
    ours.add_argument(
        "--max_enqueued_batches", type=int, default=8, help="queue bound in full batches; then 429"
    )
    ours.add_argument("--max_body_bytes", type=int, default=8 << 20, help="larger REST bodies get 413")
    ours.add_argument("--max_instances", type=int, default=1024, help="most instances in one request")
    ours.add_argument("--allow_nonfinite", type=_bool, nargs="?", const=True, default=False,
                      help="accept NaN/Inf features (rejected with 400 by default)")  # fmt: skip
    ours.add_argument("--model_version_policy", type=_policy, default=VersionPolicy("latest", 1),
                      help="latest:N (default latest:1), all, or specific:V1,V2")  # fmt: skip
    ours.add_argument(
        "--version_labels", type=_labels, default={}, help="LABEL=VERSION,... for /labels/LABEL"
    )
    ours.add_argument("--grace_period_seconds", type=float, default=10.0, help="SIGTERM drain time")
    ours.add_argument("--intra_op_threads", type=int, default=1, help="threads per model call")
    ours.add_argument("--num_workers", type=int, default=1,
                      help="server processes sharing the REST and gRPC ports (SO_REUSEPORT); each loads the model")  # fmt: skip
    ours.add_argument("--print_curl_example", type=_bool, nargs="?", const=True, default=False,
                      help="print a ready-to-paste curl predict command once a version is loaded")  # fmt: skip
    ours.add_argument("--log_level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def parse_config(argv: list[str] | None = None) -> ServerConfig:
    """Parse and check the command line; argparse exits with a message on a bad value."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in (
        "max_batch_size",
        "max_enqueued_batches",
        "max_body_bytes",
        "max_instances",
        "intra_op_threads",
        "num_workers",
    ):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    for flag in ("batch_timeout_micros", "rest_api_timeout_in_ms", "grace_period_seconds"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag} must be >= 0, got {getattr(args, flag)}")
    for flag in ("port", "rest_api_port"):
        if not 0 <= getattr(args, flag) <= 65535:
            parser.error(f"--{flag} must be a TCP port in 0..65535, got {getattr(args, flag)}")
    return ServerConfig(**vars(args))
