"""Signature keys and tensor names that every exported version serves (TF Serving's SignatureDef map)."""

from __future__ import annotations

DEFAULT_SIGNATURE = "serving_default"  # features float32 [-1, width] -> ctr, raw_score float32 [-1, 1]
RAW_SIGNATURE = "raw"  # the Criteo fields (ctr_contract.schema.RAW_FIELDS) -> ctr, raw_score float32 [-1, 1]
INPUT_NAME = "features"  # the engineered input of DEFAULT_SIGNATURE (and of model.onnx)
OUTPUT_NAME = "ctr"  # the calibrated click probability, one column
# The network's own sigmoid probability, before the negative-downsampling correction and the calibrator (what
# `ctr` was before versions carried a calibrator); versions exported before it serve `ctr` alone.
RAW_SCORE_NAME = "raw_score"
OUTPUT_NAMES = (OUTPUT_NAME, RAW_SCORE_NAME)  # every graph's outputs, in this order
DEFAULT_WIDTH = 128  # features per engineered vector unless training's `--width` says otherwise
