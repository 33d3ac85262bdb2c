import sys

from training.tune.search import main

sys.exit(main())
