"""`python -m training.simulate`: drifting traffic and its clicks for a running server (training/online/simulate.py)."""

import sys

from training.online.simulate import main

if __name__ == "__main__":
    sys.exit(main())
