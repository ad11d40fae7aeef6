"""Input-pipeline benchmark; same as `vitscale bench-data` (see vitscale/data/benchmark.py).

    python benchmarks/bench_data.py [--images 256] [--rounds 5] [--out-dir benchmarks/results]
"""

import sys

from vitscale.data.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
