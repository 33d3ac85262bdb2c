import sys

from training.model.speed import prefer_passive_omp_wait

prefer_passive_omp_wait()  # before anything imports torch

from training.cli import main  # noqa: E402

sys.exit(main())
