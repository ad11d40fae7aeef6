"""``vitscale data …``: dataset utilities (one argparse subcommand each).

``vitscale data digits OUT_DIR`` writes scikit-learn's digits with the fixed train/val split as an
image folder: ``OUT_DIR/train/<class>/<n>.png`` and ``OUT_DIR/val/<class>/<n>.png``. Other modules
add subcommands next to it: a module listed in ``PLUGIN_MODULES`` that defines
``register_data_command(subparsers)`` (e.g. the CLIP ``digits-captions``), or :func:`add_subcommand`.
"""

from __future__ import annotations

import importlib
import os

from . import DefaultsHelpFormatter

# Modules that may add `vitscale data <name>` subcommands via `register_data_command(subparsers)`.
PLUGIN_MODULES = ("vitscale.data.captions",)

_EXTRA: list = []  # callables (subparsers) -> None registered by other modules


def add_subcommand(register) -> None:
    """Register ``register(data_subparsers)`` to add a ``vitscale data <name>`` subcommand."""
    _EXTRA.append(register)


def write_digits(out_dir: str, size: int = 32) -> dict[str, int]:
    """Write the digits split as PNG image folders; returns {split: number of images}."""
    from PIL import Image

    from vitscale.data.digits import CLASS_NAMES, load_digits_split

    counts = {}
    for split in ("train", "val"):
        images, labels = load_digits_split(split, num_channels=1)  # (N, 1, 8, 8) uint8
        for name in CLASS_NAMES:
            os.makedirs(os.path.join(out_dir, split, name), exist_ok=True)
        for n, (img, y) in enumerate(zip(images, labels.tolist())):
            pil = Image.fromarray(img[0].numpy(), mode="L")
            if size and size != 8:
                pil = pil.resize((size, size), Image.Resampling.BICUBIC)
            pil.save(os.path.join(out_dir, split, CLASS_NAMES[y], f"{n:04d}.png"))
        counts[split] = len(labels)
    return counts


def _digits(args) -> int:
    counts = write_digits(args.out_dir, args.size)
    print(f"wrote {counts['train']} train and {counts['val']} val images ({args.size}x{args.size} PNG) to {args.out_dir}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "data",
        help="dataset utilities (write the digits as an image folder, ...)",
        description="Dataset utilities. `vitscale data digits OUT_DIR` writes scikit-learn's handwritten "
        "digits (fixed 1,497/300 split) as OUT_DIR/{train,val}/<class>/*.png.",
    )
    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    d = sub.add_parser("digits", help="write the digits dataset as an image folder",
                       description="Write scikit-learn's digits (train 1,497 / val 300, stratified, seed 0) "
                       "as OUT_DIR/train/<class>/*.png and OUT_DIR/val/<class>/*.png.",
                       formatter_class=DefaultsHelpFormatter)
    d.add_argument("out_dir", metavar="OUT_DIR", help="folder to write (created if missing)")
    d.add_argument("--size", type=int, default=32, help="side of the written PNGs (bicubic upsampling; 8 = native)")
    d.set_defaults(func=_digits)
    for name in PLUGIN_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue  # not built yet
            raise
        if hasattr(module, "register_data_command"):
            module.register_data_command(sub)
    for extra in _EXTRA:
        extra(sub)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
