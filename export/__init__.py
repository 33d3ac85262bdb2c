"""Export a training checkpoint into a new version of the model repository."""

from ctr_contract import disable_telemetry

disable_telemetry()  # before any export module imports onnxruntime (ctr_contract/__init__.py says why)
