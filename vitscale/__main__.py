"""``python -m vitscale …`` (what torchrun launches) behaves like the ``vitscale`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
