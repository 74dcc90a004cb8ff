"""`python -m evals.bench.gpu_check`: the GPU check's command line (`evals.bench.gpu_check.cli`)."""

import sys

from evals.bench.gpu_check.cli import main

sys.exit(main())
