"""`python -m bench.compare`: compare two bench runs figure by figure (the code lives in `bench.report.compare`)."""

from __future__ import annotations

import sys

from bench.report.compare import main

if __name__ == "__main__":
    sys.exit(main())
