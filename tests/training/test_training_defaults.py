"""One home for each default: the width in `ctr_contract.signatures`, the fit's defaults in `ctr_features.fit`."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

from ctr_contract.signatures import DEFAULT_WIDTH
from ctr_features import fit
from ctr_features.spec import FeatureSpec
from ctr_model.net import ModelConfig
from training.cli import build_parser
from training.config import TrainConfig

TRAINING = Path(__file__).resolve().parents[2] / "training"
FIT_DEFAULTS = {
    "clip": fit.CLIP,
    "min_count": fit.MIN_COUNT,
    "smoothing": fit.SMOOTHING,
    "max_entries": fit.MAX_ENTRIES,
    "vocab_size": fit.VOCAB_SIZE,
    "vocab_min_count": fit.VOCAB_MIN_COUNT,
}


def _defaults(fn: object) -> dict[str, object]:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}  # type: ignore[arg-type]


def test_the_homes_hold_the_documented_values() -> None:
    assert DEFAULT_WIDTH == 128
    assert FIT_DEFAULTS == {
        "clip": 10.0,
        "min_count": 1000,
        "smoothing": 100.0,
        "max_entries": 10_000,
        "vocab_size": 10_000,
        "vocab_min_count": 5,
    }


def test_every_width_default_is_the_contract_width() -> None:
    assert ModelConfig().width == DEFAULT_WIDTH
    assert TrainConfig().width == DEFAULT_WIDTH
    assert build_parser().parse_args([]).width == DEFAULT_WIDTH
    assert {f.name: f.default for f in dataclasses.fields(FeatureSpec)}["width"] == DEFAULT_WIDTH
    assert _defaults(FeatureSpec.fit)["width"] == DEFAULT_WIDTH
    assert _defaults(FeatureSpec.fit_streaming)["width"] == DEFAULT_WIDTH


def test_feature_spec_and_its_fit_take_their_defaults_from_the_fit_module() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(FeatureSpec)}
    kept = ("clip", "min_count", "smoothing", "vocab_size", "vocab_min_count")
    assert {k: fields[k] for k in kept} == {k: FIT_DEFAULTS[k] for k in kept}
    fit_args = {k: v for k, v in _defaults(fit.fit_parameters).items() if k != "width"}
    assert fit_args == {k: v for k, v in FIT_DEFAULTS.items() if k != "clip"}
    # FeatureSpec.fit and fit_streaming pass their settings through to fit_parameters: no default of their own.
    assert set(_defaults(FeatureSpec.fit)) == set(_defaults(FeatureSpec.fit_streaming)) == {"width"}
    assert FeatureSpec.fit_streaming(lambda numeric_only: iter(()), 60).min_count == fit.MIN_COUNT


def test_no_training_module_writes_a_width_or_fit_default_as_a_literal() -> None:
    """A parameter or field named like a default must take it from its home, never from a number in place."""
    names = {"width", *FIT_DEFAULTS}
    literals = []
    for path in sorted(TRAINING.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                pairs = [(node.target.id, node.value)]
            elif isinstance(node, ast.arguments):
                args = [*node.posonlyargs, *node.args]
                pairs = [
                    (a.arg, d)
                    for a, d in zip(args[len(args) - len(node.defaults) :], node.defaults, strict=True)
                ]
                pairs += [(a.arg, d) for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=True)]
            else:
                continue
            literals += [
                f"{path.relative_to(TRAINING.parent)}:{value.lineno} {name}"
                for name, value in pairs
                if name in names and isinstance(value, ast.Constant) and value.value is not None
            ]
    assert literals == []
