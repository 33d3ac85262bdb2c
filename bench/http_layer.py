"""`python -m bench.http_layer`: our HTTP layer against uvicorn and granian (the code lives in `bench.sections.http_layer`)."""

from __future__ import annotations

from bench.sections.http_layer import main

if __name__ == "__main__":
    main()
