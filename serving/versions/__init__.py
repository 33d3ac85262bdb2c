"""Model versions: scan the base path, check manifests, load and warm up, batch, swap, and unload when idle."""
