import sys

from training.runtime.speed import set_omp_wait_policy

set_omp_wait_policy()  # before anything imports torch

from training.cli import main  # noqa: E402

sys.exit(main())
