"""Each default lives once: `python -m export --run RUN` asks for exactly ExportRequest's defaults."""

from __future__ import annotations

from pathlib import Path

from ctr_contract import BEST_CHECKPOINT, FEATURE_SPEC
from export.__main__ import build_parser, request_from_args
from export.request import ExportRequest


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
