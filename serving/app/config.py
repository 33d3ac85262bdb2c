"""Command line: TF Serving's own flag names for what it shares, plus ours. Parsed in `main()` only."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from ctr_contract.cli_help import DefaultsHelpFormatter
from ctr_contract.tf_log import quiet_tensorflow_log
from serving.app.cpu_plan import cpu_plan
from serving.app.flags import (
    DEFAULT_CACHE_DIR,
    add_http_flags,
    add_store_flags,
    add_traffic_flags,
    add_watch_flags,
    base_path_flag,
    bool_flag,
    labels_flag,
    policy_flag,
)
from serving.app.tls import load_tls_config
from serving.http.shared import COMPRESS_MIN_BYTES
from serving.observability.tracing import read_config as read_tracing_config
from serving.repository.bucket import BasePath
from serving.repository.model_config import read_model_config
from serving.repository.policy import VersionPolicy
from serving.routing.fallback import FallbackOptions
from serving.runtime.backends import BACKENDS


@dataclass(frozen=True)
class ServerConfig:
    """Typed settings of one server process."""

    port: int
    rest_api_port: int
    host: str
    model_name: str
    model_base_path: BasePath | None  # None: the models come from --model_config_file
    backend: str
    enable_batching: bool
    max_batch_size: int
    batch_timeout_micros: int
    max_enqueued_batches: int
    file_system_poll_wait_seconds: float
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
    # Base paths in a bucket (serving/repository/bucket.py): where their versions are cached
    model_cache_dir: Path = DEFAULT_CACHE_DIR
    model_download_timeout_seconds: float = 600.0
    # Drift metrics (serving/observability/drift.py) and sampled request logs (serving/observability/request_log.py)
    drift_window: int = 10_000
    request_log_dir: Path | None = None
    request_log_sample_rate: float = 0.0
    request_log_max_bytes: int = 64 << 20
    model_statistics: bool = True  # Triton's statistics extension (serving/observability/model_stats.py)
    # TLS for gRPC and REST (serving/app/tls.py)
    ssl_config_file: Path | None = None
    # Several models from TF Serving's model config file (serving/repository/model_config.py)
    model_config_file: Path | None = None
    model_config_file_poll_wait_seconds: float = 0.0
    # OpenTelemetry tracing (serving/observability/tracing.py); None: only the OTEL_* variables turn it on
    tracing_config: Path | None = None
    # Traffic split by label (ctr_contract/traffic.py): the shares of a model with no ctr-traffic line
    canary_percent: float = 0.0
    shadow_percent: float = 0.0
    # Circuit breaking per version (serving/routing/fallback.py); fallback_error_rate 0 = off
    fallback_error_rate: float = 0.5
    fallback_min_requests: int = 5
    fallback_window_s: float = 10.0
    fallback_cooldown_s: float = 30.0
    fallback_probe_every: int = 10

    def __post_init__(self) -> None:
        """Check every bound here, so that `dataclasses.replace()` is checked as much as the command line."""
        for flag in _AT_LEAST_ONE:
            if getattr(self, flag) < 1:
                raise ValueError(f"--{flag} must be >= 1, got {getattr(self, flag)}")
        for flag in _NOT_NEGATIVE:
            if getattr(self, flag) < 0:
                raise ValueError(f"--{flag} must be >= 0, got {getattr(self, flag)}")
        for flag in ("file_system_poll_wait_seconds", "model_config_file_poll_wait_seconds"):
            if not -math.inf < getattr(self, flag) < math.inf:  # NaN fails both
                raise ValueError(f"--{flag} must be a number of seconds, got {getattr(self, flag)}")
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
        self.fallback_options()  # raises ValueError naming a bad --fallback_* flag
        for flag in ("canary_percent", "shadow_percent"):
            if not 0.0 <= getattr(self, flag) <= 100.0:
                raise ValueError(f"--{flag} must be in [0, 100], got {getattr(self, flag)}")
        for flag in ("port", "rest_api_port"):
            if not 0 <= getattr(self, flag) <= 65535:
                raise ValueError(f"--{flag} must be a TCP port in 0..65535, got {getattr(self, flag)}")

    def fallback_options(self) -> FallbackOptions:
        """The --fallback_* flags as the breakers take them (serving/routing/fallback.py)."""
        return FallbackOptions(
            self.fallback_error_rate,
            self.fallback_min_requests,
            self.fallback_window_s,
            self.fallback_cooldown_s,
            self.fallback_probe_every,
        )


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
    "model_download_timeout_seconds",
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
        type=base_path_flag,
        default=None,
        help="folder holding numeric version folders, or s3://BUCKET/PREFIX holding them (cached in "
        "--model_cache_dir) (default: none; give it or --model_config_file)",
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
        type=float,
        default=0.0,
        help="seconds between re-reads of --model_config_file (whole seconds, or a fraction: 0.1); 0 reads it once",
    )
    tf.add_argument(
        "--enable_batching",
        type=bool_flag,
        nargs="?",
        const=True,
        default=False,
        help="merge concurrent requests into batches of up to --max_batch_size rows",
    )
    tf.add_argument(
        "--file_system_poll_wait_seconds",
        type=float,
        default=1.0,
        help="seconds between scans for new versions (TF Serving's whole seconds, or a fraction: 0.1); 0 scans once",
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
        type=bool_flag,
        nargs="?",
        const=True,
        default=False,
        help="accept NaN/Inf features (rejected with 400 by default)",
    )
    ours.add_argument(
        "--model_version_policy",
        type=policy_flag,
        default=VersionPolicy("latest", 1),
        help="latest:N (default latest:1), all, or specific:V1,V2",
    )
    ours.add_argument(
        "--version_labels", type=labels_flag, default={}, help="LABEL=VERSION,... for /labels/LABEL"
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
    add_store_flags(ours)
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
        type=bool_flag,
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
    add_watch_flags(p)
    add_http_flags(p)
    add_traffic_flags(p)
    breaker = p.add_argument_group("circuit breaking and fallback (docs/serving-fallback.md)")
    breaker.add_argument(
        "--fallback_error_rate",
        type=float,
        default=0.5,
        help="share of a version's outcomes in the window (errors, non-finite outputs, deadline misses) that "
        "opens its circuit: routed requests then go to the last good version; 0 = off (no breaking, no retry)",
    )
    breaker.add_argument(
        "--fallback_min_requests",
        type=int,
        default=5,
        help="outcomes a version needs in the window before its circuit can open",
    )
    breaker.add_argument(
        "--fallback_window_s", type=float, default=10.0, help="the rolling window the rate is taken over"
    )
    breaker.add_argument(
        "--fallback_cooldown_s",
        type=float,
        default=30.0,
        help="seconds an open circuit waits before it is half-open and probes the version",
    )
    breaker.add_argument(
        "--fallback_probe_every",
        type=int,
        default=10,
        help="half-open: one routed request in this many goes to the version (3 good ones close the circuit)",
    )
    p.add_argument_group("tracing (OpenTelemetry, opt-in: docs/serving.md)").add_argument(
        "--tracing_config",
        type=Path,
        default=None,
        help="export spans over OTLP as this JSON file says (default: none; tracing is then on only when "
        "OTEL_TRACES_EXPORTER=otlp or OTEL_EXPORTER_OTLP_ENDPOINT is set)",
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
