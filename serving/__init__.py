"""TF-Serving-compatible model server for the CTR model repository (`python -m serving`)."""
