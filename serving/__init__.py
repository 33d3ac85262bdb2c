"""TF-Serving-compatible model server for the CTR model repository (`python -m serving`)."""

from ctr_contract import disable_telemetry

disable_telemetry()  # before any serving module imports onnxruntime (ctr_contract/__init__.py says why)
