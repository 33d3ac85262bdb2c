"""`python -m bench.http_attack`: hostile HTTP clients against a REST port (the code lives in `bench.sections.http_attack`)."""

from __future__ import annotations

from bench.sections.http_attack import main

if __name__ == "__main__":
    main()
