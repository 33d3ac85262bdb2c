"""Export a training checkpoint into a new version of the model repository."""

from ctr_contract.offline import disable_telemetry

disable_telemetry()  # before any export module imports onnxruntime (ctr_contract/offline.py says why)
