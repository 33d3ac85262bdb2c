"""`python -m bench.section_runner`: one measured section in its own process (the code lives in `bench.harness.section_runner`)."""

from __future__ import annotations

import sys

from bench.harness.section_runner import main

if __name__ == "__main__":
    sys.exit(main())
