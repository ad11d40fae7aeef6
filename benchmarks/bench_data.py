"""Input-pipeline benchmark; the same as `vitscale bench-data` (see vitscale/bench/data_pipeline.py).

    python benchmarks/bench_data.py [--images 256] [--rounds 5] [--out-dir benchmarks/results]
"""

import sys

from vitscale.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench-data", *sys.argv[1:]]))
