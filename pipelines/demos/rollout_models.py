"""The rollout demo's three versions: `python -m pipelines.demos.rollout_models --out DIR ...`, one process.

- Version 1, the stable one: --v1-rows rows of the world at --start-day, one epoch, calibrated on --bad-rows
  other rows of that day.
- Version 2, the good candidate: --v2-rows other rows of that day, two epochs; it passes export's quality
  gate against version 1.
- Version 3, the bad candidate. --bad `shifted` (the default): version 2's network with a calibrator fitted
  on rows whose clicked rows were counted three times, so it predicts too many clicks, its AUC unchanged;
  `shuffled`: a network trained one epoch on version 2's rows with their labels permuted, so it ranks at
  chance, its mean score still the click rate. Export's gate refuses it; it is published with `--force`, as if
  it had slipped past the offline gate.

Training and export run in this process (`training.cli.main`, `export.pipeline.export_version`, as the online
trainer does), so PyTorch, Lightning and TensorFlow are imported once. Version 1 goes straight into DIR/repo;
versions 2 and 3 are exported into DIR/staging (a copy of DIR/repo, so the gate compares them with what is
published) and moved into DIR/repo when their turn comes (`publish`: one rename, so nothing polling the
repository sees half a version). DIR/models/vN.done marks each version ready.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import sys
from pathlib import Path

BAD_KINDS = ("shifted", "shuffled")


def done(out: Path, version: int) -> Path:
    """The file that says version `version` is exported (into OUT/repo for 1, OUT/staging for 2 and 3)."""
    return out / "models" / f"v{version}.done"


def publish(out: Path, version: int) -> None:
    """Move a staged version into OUT/repo (one rename on the same file system)."""
    os.rename(out / "staging" / str(version), out / "repo" / str(version))


def miscounted(src: Path, dst: Path, how: str) -> Path:
    """A copy of a Criteo file whose clicks are wrong: `shifted` (clicked rows 3x) or `shuffled` (labels permuted)."""
    lines = src.read_text().splitlines(keepends=True)
    if how == "shuffled":
        labels = [line.split("\t", 1)[0] for line in lines]
        random.Random(0).shuffle(labels)
        dst.write_text(
            "".join(y + "\t" + line.split("\t", 1)[1] for y, line in zip(labels, lines, strict=True))
        )
    else:
        dst.write_text("".join(line * (3 if line.startswith("1\t") else 1) for line in lines))
    return dst


def _synth(out: Path, rows: int, day: float, a: argparse.Namespace, seed: int) -> Path:
    from training.synth import main as synth_main

    argv = ["--out", str(out), "--rows", str(rows), "--day", str(day), "--seed", str(seed)]
    synth_main([*argv, "--drift-scale", str(a.drift_scale)])
    return out


def _train(data: Path, run_dir: Path, epochs: int) -> Path:
    from training.cli import main as train_main

    argv = ["--data", str(data), "--out", str(run_dir), "--no-progress-bar", "--max-epochs", str(epochs)]
    code = train_main([*argv, "--batch-size", "512", "--threads", "1"])
    if code != 0:
        sys.exit(f"rollout_models: error: training {run_dir} exited {code}")
    return run_dir


def _export(run_dir: Path, repo: Path, version: int, *extra: str) -> None:
    from ctr_contract.tf_log import quiet_tensorflow_import

    with quiet_tensorflow_import():
        import tensorflow  # noqa: F401
    from export.__main__ import build_parser, request_from_args
    from export.pipeline import export_version

    argv = ["--run", str(run_dir), "--repo", str(repo), "--version", str(version), "--no-torchscript", *extra]
    result = export_version(request_from_args(build_parser().parse_args(argv)))
    gate = result.quality_gate or {}
    print(
        f"rollout_models: version {version} exported into {repo}; gate {gate.get('verdict', gate.get('passed'))}"
    )


def build(a: argparse.Namespace) -> None:
    out: Path = a.out
    work = out / "models"
    work.mkdir(parents=True, exist_ok=True)
    # The demo's traffic starts at --start-day and drifts slowly: a version trained on a later day would be
    # miscalibrated on it.
    day2 = a.start_day
    run1 = _train(_synth(work / "v1.txt", a.v1_rows, a.start_day, a, 1), work / "run1", 1)
    cal1 = _synth(work / "calibration1.txt", a.bad_rows, a.start_day, a, 4)  # v1's validation rows: too few
    _export(run1, out / "repo", 1, "--calibration-data", str(cal1))
    shutil.copytree(out / "repo", out / "staging")
    done(out, 1).touch()
    run2 = _train(_synth(work / "v2.txt", a.v2_rows, day2, a, 2), work / "run2", 2)
    _export(run2, out / "staging", 2)
    done(out, 2).touch()
    if a.bad == "shuffled":  # a network that learnt nothing, calibrated to the mean click rate
        run3 = _train(miscounted(work / "v2.txt", work / "shuffled.txt", a.bad), work / "run3", 1)
        _export(run3, out / "staging", 3, "--force")
    else:  # version 2's network, its calibrator fitted on too many clicks
        bad = miscounted(
            _synth(work / "calibration.txt", a.bad_rows, day2, a, 3), work / "shifted.txt", a.bad
        )
        _export(run2, out / "staging", 3, "--calibration", "platt", "--calibration-data", str(bad), "--force")
    done(out, 3).touch()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.demos.rollout_models", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--out", type=Path, required=True, help="the demo's folder: writes OUT/repo, OUT/staging, OUT/models"
    )
    p.add_argument("--v1-rows", type=int, default=3000, help="version 1's rows (default 3000)")
    p.add_argument("--v2-rows", type=int, default=30000, help="version 2's rows (default 30000)")
    p.add_argument(
        "--bad-rows",
        type=int,
        default=20000,
        help="rows of version 1's and version 3's calibration files (default 20000)",
    )
    p.add_argument(
        "--bad", choices=BAD_KINDS, default="shifted", help="how version 3's clicks are miscounted"
    )
    p.add_argument("--start-day", type=float, default=0.0)
    p.add_argument("--drift-scale", type=float, default=24.0)
    a = p.parse_args(argv)
    with contextlib.suppress(FileExistsError):
        (a.out / "repo").mkdir(parents=True)
    build(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
