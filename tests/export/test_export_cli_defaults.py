"""Each default lives once: `python -m export --run RUN` asks for exactly ExportRequest's defaults, and for the
request `ExportRequest.from_run` builds in Python (the online trainer's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctr_contract import BEST_CHECKPOINT, FEATURE_SPEC
from ctr_contract.run_dir import METRICS, TRAIN_FEATURES_SAMPLE, VAL_FEATURES, VAL_LABELS, VAL_RAW
from export.__main__ import build_parser, request_from_args
from export.errors import InputError
from export.request import RUN_FILES, ExportRequest


def test_the_cli_without_options_builds_the_default_request(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / BEST_CHECKPOINT).parent.mkdir(parents=True)
    (run / BEST_CHECKPOINT).touch()  # only the paths matter here: nothing is read
    (run / FEATURE_SPEC).touch()
    args = build_parser().parse_args(["--run", str(run)])
    assert request_from_args(args) == ExportRequest(
        checkpoint=run / BEST_CHECKPOINT, feature_spec=run / FEATURE_SPEC, run=run
    )


def test_help_shows_the_request_defaults() -> None:
    text = build_parser().format_help()
    defaults = ExportRequest(checkpoint=Path("c"), feature_spec=Path("f"))
    for shown in (
        f"default: {defaults.repo})",
        f"default: {defaults.opset})",
        f"default: {defaults.parity_rows})",
        f"default: {defaults.parity_tol})",
    ):
        assert shown in " ".join(text.split()), shown


def test_a_run_with_every_sample_gives_the_cli_and_from_run_one_request(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / BEST_CHECKPOINT).parent.mkdir(parents=True)
    for rel in (BEST_CHECKPOINT, FEATURE_SPEC, *RUN_FILES.values()):
        (run / rel).touch()
    held_out = tmp_path / "interval-000000007.parquet"
    held_out.touch()
    args = build_parser().parse_args(["--run", str(run), "--version", "3", "--eval-data", str(held_out)])
    expected = ExportRequest(
        checkpoint=run / BEST_CHECKPOINT,
        feature_spec=run / FEATURE_SPEC,
        val_features=run / VAL_FEATURES,
        val_labels=run / VAL_LABELS,
        val_raw=run / VAL_RAW,
        train_features=run / TRAIN_FEATURES_SAMPLE,
        metrics=run / METRICS,
        run=run,
        version=3,
        eval_data=held_out,
    )
    assert request_from_args(args) == ExportRequest.from_run(run, version=3, eval_data=held_out) == expected


def test_a_lone_checkpoint_takes_the_samples_beside_its_spec_and_has_no_run(tmp_path: Path) -> None:
    spec, ckpt = tmp_path / "spec" / FEATURE_SPEC, tmp_path / "model.ckpt"
    spec.parent.mkdir()
    for path in (spec, ckpt, spec.parent / VAL_FEATURES, spec.parent / METRICS):
        path.touch()
    args = build_parser().parse_args(["--checkpoint", str(ckpt), "--feature-spec", str(spec)])
    assert request_from_args(args) == ExportRequest(
        checkpoint=ckpt, feature_spec=spec, val_features=spec.parent / VAL_FEATURES
    )


def test_a_request_built_in_python_checks_its_numbers_as_the_cli_does() -> None:
    with pytest.raises(InputError, match=r"^--max-auc-drop and --max-ece-rise must be >= 0, got -0.1, 0.01$"):
        ExportRequest(checkpoint=Path("c"), feature_spec=Path("f"), max_auc_drop=-0.1)
