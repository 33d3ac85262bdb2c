"""The measured sections of `make bench` and the standalone comparisons (DDP, HTTP layer), one module each."""
