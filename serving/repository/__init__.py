"""The model repository: scan version folders, check manifests, load and warm up; version states, policy."""
