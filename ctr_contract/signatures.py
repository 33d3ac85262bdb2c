"""Signature keys and tensor names that every exported version serves (TF Serving's SignatureDef map)."""

from __future__ import annotations

DEFAULT_SIGNATURE = "serving_default"  # features float32 [-1, width] -> ctr float32 [-1, 1]
RAW_SIGNATURE = "raw"  # the Criteo fields (ctr_contract.schema.RAW_FIELDS) -> ctr float32 [-1, 1]
INPUT_NAME = "features"  # the engineered input of DEFAULT_SIGNATURE (and of model.onnx)
OUTPUT_NAME = "ctr"  # the click probability, one column
DEFAULT_WIDTH = 128  # features per engineered vector unless training's `--width` says otherwise
