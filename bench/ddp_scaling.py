"""`python -m bench.ddp_scaling`: DDP samples/s at 1 and 2 processes (the code lives in `bench.sections.ddp_scaling`)."""

from __future__ import annotations

import sys

from bench.sections.ddp_scaling import main

if __name__ == "__main__":
    sys.exit(main())
