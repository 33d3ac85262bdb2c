"""Command line: TF Serving's own flag names for what it shares, plus ours. Parsed in `main()` only."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ctr_contract.cli_help import DefaultsHelpFormatter
from ctr_contract.repository import parse_version_dir
from ctr_contract.tf_log import quiet_tensorflow_log
from serving.app.cpu_plan import cpu_plan
from serving.app.tls import load_tls_config
from serving.http.shared import COMPRESS_MIN_BYTES
from serving.observability.tracing import read_config as read_tracing_config
from serving.repository.model_config import read_model_config
from serving.repository.policy import VersionPolicy
from serving.runtime.backends import BACKENDS


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
        number = parse_version_dir(version)  # a label names a version folder: the same rule
        if not name or number is None:
            raise argparse.ArgumentTypeError(f"expected LABEL=VERSION pairs such as stable=1, got {pair!r}")
        labels[name] = number
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
    model_base_path: Path | None  # None: the models come from --model_config_file
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
    # REST connection limits (serving/http/shared.py HttpLimits)
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 30.0
    keepalive_timeout_seconds: float = 75.0
    max_header_bytes: int = 64 << 10
    max_headers: int = 200
    max_connections: int = 1024
    max_output_bytes: int = 1 << 20
    max_buffered_bytes: int = 64 << 20
    response_compression_min_bytes: int = COMPRESS_MIN_BYTES
    # Version folders (serving/repository/manager.py)
    manifest_wait_timeout_seconds: float = 600.0
    model_load_timeout_seconds: float = 600.0
    # Drift metrics (serving/observability/drift.py) and sampled request logs (serving/observability/request_log.py)
    drift_window: int = 10_000
    request_log_dir: Path | None = None
    request_log_sample_rate: float = 0.0
    request_log_max_bytes: int = 64 << 20
    # TLS for gRPC and REST (serving/app/tls.py)
    ssl_config_file: Path | None = None
    # Several models from TF Serving's model config file (serving/repository/model_config.py)
    model_config_file: Path | None = None
    model_config_file_poll_wait_seconds: int = 0
    # OpenTelemetry tracing (serving/observability/tracing.py); None: only the OTEL_* variables turn it on
    tracing_config: Path | None = None

    def __post_init__(self) -> None:
        """Check every bound here, so that `dataclasses.replace()` is checked as much as the command line."""
        for flag in _AT_LEAST_ONE:
            if getattr(self, flag) < 1:
                raise ValueError(f"--{flag} must be >= 1, got {getattr(self, flag)}")
        for flag in _NOT_NEGATIVE:
            if getattr(self, flag) < 0:
                raise ValueError(f"--{flag} must be >= 0, got {getattr(self, flag)}")
        for flag in ("header_timeout_seconds", "body_timeout_seconds", "keepalive_timeout_seconds"):
            if not getattr(self, flag) > 0:
                raise ValueError(f"--{flag} must be > 0, got {getattr(self, flag)}")
        if not 0.0 <= self.request_log_sample_rate <= 1.0:
            raise ValueError(
                f"--request_log_sample_rate must be in [0, 1], got {self.request_log_sample_rate}"
            )
        if self.request_log_sample_rate > 0 and self.request_log_dir is None:
            raise ValueError("--request_log_sample_rate needs --request_log_dir DIR")
        if self.drift_window < 0 or self.request_log_max_bytes < 1:
            raise ValueError(
                f"--drift_window must be >= 0 and --request_log_max_bytes >= 1, got {self.drift_window} "
                f"and {self.request_log_max_bytes}"
            )
        if (self.model_base_path is None) == (self.model_config_file is None):
            raise ValueError(
                "give --model_base_path (one model, named by --model_name) or --model_config_file (several), "
                "not both and not neither"
            )
        if self.model_config_file_poll_wait_seconds < 0:
            raise ValueError(
                f"--model_config_file_poll_wait_seconds must be >= 0, got {self.model_config_file_poll_wait_seconds}"
            )
        for flag in ("port", "rest_api_port"):
            if not 0 <= getattr(self, flag) <= 65535:
                raise ValueError(f"--{flag} must be a TCP port in 0..65535, got {getattr(self, flag)}")


_AT_LEAST_ONE = (
    "max_batch_size",
    "max_enqueued_batches",
    "max_body_bytes",
    "max_instances",
    "intra_op_threads",
    "num_workers",
    "max_header_bytes",
    "max_headers",
    "max_connections",
    "max_output_bytes",
    "max_buffered_bytes",
)
_NOT_NEGATIVE = (
    "batch_timeout_micros",
    "rest_api_timeout_in_ms",
    "grace_period_seconds",
    "manifest_wait_timeout_seconds",
    "model_load_timeout_seconds",
    "response_compression_min_bytes",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m serving",
        description="TF-Serving-compatible model server (REST + gRPC) for the CTR model repository.",
        formatter_class=DefaultsHelpFormatter,
    )
    tf = p.add_argument_group("TF Serving flags (same names and meaning)")
    tf.add_argument("--port", type=int, default=8500, help="gRPC port")
    tf.add_argument("--rest_api_port", type=int, default=8501, help="REST port; 0 disables REST")
    tf.add_argument("--model_name", default="default", help="name in /v1/models/NAME and ModelSpec.name")
    tf.add_argument(
        "--model_base_path",
        type=Path,
        default=None,
        help="folder holding numeric version folders (default: none; give it or --model_config_file)",
    )
    tf.add_argument(
        "--model_config_file",
        type=Path,
        default=None,
        help="ModelServerConfig text proto (model_config_list): several models instead of --model_base_path "
        "(default: none, one model from --model_base_path)",
    )
    tf.add_argument(
        "--model_config_file_poll_wait_seconds",
        type=int,
        default=0,
        help="seconds between re-reads of --model_config_file; 0 reads it once",
    )
    tf.add_argument(
        "--enable_batching",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="merge concurrent requests into batches of up to --max_batch_size rows",
    )
    tf.add_argument(
        "--file_system_poll_wait_seconds",
        type=int,
        default=1,
        help="seconds between scans for new versions; 0 scans once",
    )
    tf.add_argument(
        "--rest_api_timeout_in_ms", type=int, default=30000, help="deadline of a queued request; 0 = none"
    )
    tf.add_argument(
        "--ssl_config_file",
        type=Path,
        default=None,
        help="SSLConfig text proto (server_key, server_cert, custom_ca, client_verify): TLS on gRPC and REST "
        "(default: none, plaintext)",
    )
    ours = p.add_argument_group("ctr-pipeline flags")
    ours.add_argument("--host", default="0.0.0.0", help="bind address (0.0.0.0 in containers)")
    ours.add_argument(
        "--backend", choices=BACKENDS, default="onnx", help="onnx: model.onnx; tf: saved_model.pb"
    )
    ours.add_argument("--max_batch_size", type=int, default=256, help="rows per merged batch")
    ours.add_argument(
        "--batch_timeout_micros",
        type=int,
        default=0,
        help="longest a batch waits for more rows; 0 = take what is queued when the model is free",
    )
    ours.add_argument(
        "--max_enqueued_batches", type=int, default=8, help="queue bound in full batches; then 429"
    )
    ours.add_argument("--max_body_bytes", type=int, default=8 << 20, help="larger REST bodies get 413")
    ours.add_argument("--max_instances", type=int, default=1024, help="most instances in one request")
    ours.add_argument(
        "--allow_nonfinite",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="accept NaN/Inf features (rejected with 400 by default)",
    )
    ours.add_argument(
        "--model_version_policy",
        type=_policy,
        default=VersionPolicy("latest", 1),
        help="latest:N (default latest:1), all, or specific:V1,V2",
    )
    ours.add_argument(
        "--version_labels", type=_labels, default={}, help="LABEL=VERSION,... for /labels/LABEL"
    )
    ours.add_argument(
        "--manifest_wait_timeout_seconds",
        type=float,
        default=600.0,
        help="how long a version folder may stay incomplete (no manifest.json yet, files missing) "
        "before it is rejected; 0 = wait forever",
    )
    ours.add_argument(
        "--model_load_timeout_seconds",
        type=float,
        default=600.0,
        help="a version whose check, load and warm-up take longer fails alone; 0 = no limit",
    )
    ours.add_argument("--grace_period_seconds", type=float, default=10.0, help="SIGTERM drain time")
    ours.add_argument(
        "--intra_op_threads",
        type=int,
        default=None,
        help="ONNX Runtime threads per model call; default: the cgroup CPU limit / --num_workers, "
        "1 without a limit (serving/app/cpu_plan.py)",
    )
    ours.add_argument(
        "--num_workers",
        type=int,
        default=None,
        help="server processes sharing the REST and gRPC ports (SO_REUSEPORT); each loads the model; "
        "default: the cgroup CPU limit rounded up, 1 without a limit",
    )
    ours.add_argument(
        "--print_curl_example",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="print a ready-to-paste curl predict command once a version is loaded",
    )
    ours.add_argument(
        "--log_level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="the least severe log lines written; debug also keeps TensorFlow's C++ log (--backend tf)",
    )
    watch = p.add_argument_group("drift metrics and request logs (the daily loop: docs/daily-loop.md)")
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
    p.add_argument_group("tracing (OpenTelemetry, opt-in: docs/serving.md)").add_argument(
        "--tracing_config",
        type=Path,
        default=None,
        help="export spans over OTLP as this JSON file says (default: none; tracing is then on only when "
        "OTEL_TRACES_EXPORTER=otlp or OTEL_EXPORTER_OTLP_ENDPOINT is set)",
    )
    http.add_argument(
        "--response_compression_min_bytes",
        type=int,
        default=COMPRESS_MIN_BYTES,
        help="REST responses larger than this are compressed (gzip, else deflate) for a client whose "
        "Accept-Encoding takes it; 0 compresses every non-empty response (measured: "
        "docs/perf/serving-compression.md)",
    )
    return p


def parse_config(argv: list[str] | None = None) -> ServerConfig:
    """Parse and check the command line; argparse exits with a message on a bad value."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.num_workers, args.intra_op_threads = cpu_plan(args.num_workers, args.intra_op_threads)
    try:
        cfg = ServerConfig(**vars(args))
    except ValueError as exc:  # ServerConfig checks its flags' bounds: the usage, then what is wrong
        parser.error(str(exc))
    try:
        if cfg.ssl_config_file is not None:
            load_tls_config(cfg.ssl_config_file)  # a bad file stops the start here, before any port opens
        if cfg.model_config_file is not None:
            read_model_config(cfg.model_config_file)  # likewise: the first config must be good
        read_tracing_config(cfg.tracing_config)
    except ValueError as exc:  # the file is wrong, not the command line: one line naming it, no usage
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    if cfg.backend == "tf":  # before any worker imports TensorFlow; `--log_level debug` keeps its C++ log
        quiet_tensorflow_log(verbose=cfg.log_level == "debug")
    return cfg
