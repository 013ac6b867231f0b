"""Imported first by the `farm` command (farm.cli.main), before anything loads numpy: numpy's OpenBLAS starts a
thread per CPU as it loads, and they spin for about 0.1 s of CPU each before they sleep. farm calls no BLAS routine
that needs them, and on two cores they took that time from the build's planning and from each compile process (all
of which import numpy): a cold `farm submit` of resnet18_style 3.31-3.49 s, 3.32-3.35 with one BLAS thread,
alternating, on the Xeon. A value the user set is kept."""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
