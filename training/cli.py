"""`python -m training`: train the CTR model on a Criteo-format file and write the run directory."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ctr_contract.cli_help import RawDescriptionDefaultsHelpFormatter
from ctr_model.net import ACTIVATIONS
from training.config import LOADERS, TrainConfig
from training.errors import TrainingError
from training.runtime.speed import ADAM_IMPLS
from training.tune.params import load_tuned_params

_EPILOG = """examples:
  python -m training --data artifacts/data/train.txt --out artifacts/run
  python -m training --data 's3://BUCKET/criteo/day_*.gz' --cache-dir /tmp/ctr-cache   # from a bucket
  python -m training --devices 2 --accelerator cpu                  # 2-process DDP (gloo) on one machine
  torchrun --nnodes 2 --nproc-per-node 4 --node-rank 0 --master-addr HOST --master-port 29500 \\
      -m training --accelerator gpu --devices 4 --num_nodes 2       # then --node-rank 1 on the second node
"""


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(
        prog="python -m training",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=RawDescriptionDefaultsHelpFormatter,
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        default=d.data,
        help="Criteo data: a file, a directory or a quoted glob of Kaggle TSV / CSV-with-header files "
        "(plain, .gz, .zst or .bz2), or of Parquet files, read as one data set; on disk or in a bucket "
        "(s3://BUCKET/KEY, a prefix or a glob of keys, streamed; the store from AWS_ENDPOINT_URL and the AWS "
        f"credential variables, docs/training-data.md) (default {d.data})",
    )
    g.add_argument("--out", type=Path, default=d.out, help=f"run directory to write (default {d.out})")
    g.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="folder for the Parquet caches and prepared records (default: beside the data when writable, "
        "else $XDG_CACHE_HOME/ctr-pipeline or ~/.cache/ctr-pipeline)",
    )
    g.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="count and skip malformed rows instead of failing on the first (default: off)",
    )
    g.add_argument(
        "--max-rows", type=int, default=None, help="use only the first N rows of the file (default: all rows)"
    )
    g.add_argument(
        "--val-fraction",
        type=float,
        default=d.val_fraction,
        help=f"validation share (default {d.val_fraction})",
    )
    g.add_argument("--width", type=int, default=d.width, help=f"feature vector width (default {d.width})")
    g.add_argument(
        "--loader",
        choices=LOADERS,
        default=d.loader,
        help="stream: rows stream from Parquet through a shuffle buffer, memory flat in the row count; "
        "memory: features held in each process (faster per epoch); auto (default): memory only when the "
        "features take at most 1 GiB and a quarter of the available memory per process (in a container: "
        "what its cgroup memory limit leaves)",
    )
    g.add_argument(
        "--shuffle-buffer",
        type=int,
        default=d.shuffle_buffer,
        help=f"rows each process's shuffle buffer mixes when streaming (default {d.shuffle_buffer}): it holds "
        "their record numbers (16 bytes a row) and reads the records from the mapped cache file, so it takes "
        f"{d.shuffle_buffer * 16 // 2**20} MiB at any width",
    )
    g = p.add_argument_group("model and optimiser")
    g.add_argument(
        "--activation",
        choices=ACTIVATIONS,
        default=d.activation,
        help=f"hidden activation (default {d.activation})",
    )
    g.add_argument(
        "--batch-size", type=int, default=d.batch_size, help=f"per-rank batch size (default {d.batch_size})"
    )
    g.add_argument(
        "--dropout1", type=float, default=d.dropout1, help=f"dropout after layer 1 (default {d.dropout1})"
    )
    g.add_argument(
        "--dropout2", type=float, default=d.dropout2, help=f"dropout after layer 2 (default {d.dropout2})"
    )
    g.add_argument(
        "--config",
        type=Path,
        default=None,
        help="tuned hyperparameters: the best.json of `make tune` (options given here still win; default: none)",
    )
    g.add_argument(
        "--max-epochs", type=int, default=d.max_epochs, help=f"epoch limit (default {d.max_epochs})"
    )
    g.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr})")
    g.add_argument(
        "--weight-decay",
        type=float,
        default=d.weight_decay,
        help=f"Adam weight decay (default {d.weight_decay})",
    )
    g.add_argument(
        "--adam-impl",
        choices=ADAM_IMPLS,
        default=d.adam_impl,
        help="torch Adam implementation (default auto: fused; `default` is torch's choice)",
    )
    g.add_argument(
        "--patience",
        type=int,
        default=d.patience,
        help=f"early stopping: epochs without val AUC gain (default {d.patience})",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        help=f"seed for weights, shuffling and negative sampling (default {d.seed})",
    )
    g.add_argument(
        "--negative-sample-rate",
        type=float,
        default=d.negative_sample_rate,
        metavar="W",
        help="train on every positive and this share of the training negatives, picked by a hash of "
        "(row id, --seed); validation keeps every row; export corrects the probabilities by "
        f"sigmoid(logit + ln W) (0 < W <= 1; default {d.negative_sample_rate:g}: every row)",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads per process (default on CPU: the cgroup CPU limit, else the cores, // "
        "--devices; on GPU: torch's choice)",
    )
    g = p.add_argument_group("hardware and distribution")
    g.add_argument("--accelerator", default=d.accelerator, help=f"cpu, gpu or auto (default {d.accelerator})")
    g.add_argument("--devices", type=int, default=d.devices, help="processes per node (default 1)")
    g.add_argument("--num_nodes", "--num-nodes", type=int, default=d.num_nodes, help="nodes (default 1)")
    g.add_argument(
        "--strategy",
        default=d.strategy,
        help="auto (DDP when more than one process), ddp, or a Lightning strategy",
    )
    g.add_argument(
        "--precision",
        default=d.precision,
        help=f"Lightning precision: 32-true, 16-mixed, bf16-mixed (default {d.precision}: bf16-mixed on CPUs "
        "with AVX512_BF16/AMX and on GPUs, else 32-true)",
    )
    g.add_argument(
        "--no-fast-dropout",
        dest="fast_dropout",
        action="store_false",
        help="use torch's dropout on CPU too (default: numpy-drawn masks on CPU, same keep probabilities)",
    )
    g.add_argument(
        "--no-malloc-tuning",
        dest="malloc_tuning",
        action="store_false",
        help="keep glibc's malloc defaults (default: freed tensors stay in the heap for the next step; "
        "MALLOC_*_ or GLIBC_TUNABLES in the environment win)",
    )
    g.add_argument(
        "--ddp-timeout",
        type=float,
        default=d.ddp_timeout,
        help=f"seconds ranks wait for each other (default {d.ddp_timeout:g})",
    )
    g = p.add_argument_group("run control")
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT/checkpoints/last.ckpt (default: off, a fresh run)",
    )
    g.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="warm start: weights and frozen feature spec from a checkpoint, run dir, published version "
        "folder or model base path (its newest version); see training/model/warm_start.py (default: none, "
        "random weights and a spec fitted on --data)",
    )
    g.add_argument(
        "--no-progress-bar",
        dest="progress_bar",
        action="store_false",
        help="disable the progress bar (default: shown)",
    )
    g.add_argument(
        "--sample-audit",
        action="store_true",
        help="write the row indices each rank trained on per epoch to OUT/sample_audit/ (default: off)",
    )
    return p


def parse_config(argv: Sequence[str] | None = None, base: TrainConfig | None = None) -> TrainConfig:
    """The run `python -m training ARGV` asks for, over `base` (default: TrainConfig()).

    Precedence, lowest first: `base`, a `--config` file's tuned values, the options in `argv`.

    Raises:
        SystemExit: (argparse, code 2) an unknown option or a malformed value.
        ConfigError: values that do not make a run; OSError: an unreadable `--config` file.
    """
    parser = build_parser()
    if base is not None:
        parser.set_defaults(**vars(base))
    args = parser.parse_args(argv)
    if args.config is not None:
        # The file's values become defaults, so an option on the command line still overrides them.
        parser.set_defaults(**load_tuned_params(args.config))
        args = parser.parse_args(argv)
    return TrainConfig(**{k: v for k, v in vars(args).items() if k != "config"})


def main(argv: list[str] | None = None) -> int:
    """Exit 0 on success, 1 when the run fails (bad data, NaN loss, DDP setup), 2 on invalid options.

    Only a `TrainingError` or an `OSError` that names a file is the user's to fix and prints one line; any
    other exception is a bug and propagates with its traceback.
    """
    try:
        cfg = parse_config(argv)
    except (TrainingError, OSError) as e:
        return _user_error(e, 2)
    from training.train import run_training  # heavy imports after argument checks (fast --help)

    try:
        run_training(cfg)
    except (TrainingError, OSError) as e:
        return _user_error(e, 1)
    return 0


def _user_error(e: TrainingError | OSError, code: int) -> int:
    """Print `error: <message>` and return `code`; re-raise an OSError that names no file (not the user's)."""
    if isinstance(e, OSError) and not isinstance(e, TrainingError) and e.filename is None:
        raise e
    print(f"error: {e}", file=sys.stderr)
    return code
