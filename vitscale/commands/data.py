"""``vitscale data …``: dataset utilities (one argparse subcommand each).

``vitscale data digits OUT_DIR`` writes scikit-learn's digits with the fixed train/val split as an
image folder: ``OUT_DIR/train/<class>/<n>.png`` and ``OUT_DIR/val/<class>/<n>.png``.
``vitscale data digits-captions OUT_DIR`` writes them as captioned WebDataset shards (CLIP).
"""

from __future__ import annotations

from . import DefaultsHelpFormatter


def _digits(args) -> int:
    from vitscale.data.digits import write_digits_folders

    counts = write_digits_folders(args.out_dir, args.size)
    print(f"wrote {counts['train']} train and {counts['val']} val images ({args.size}x{args.size} PNG) to {args.out_dir}")
    return 0


def _digits_captions(args) -> int:
    from vitscale.data.captions import write_digits_captions

    counts = write_digits_captions(args.out_dir, args.size, args.shard_size)
    print(
        f"wrote {counts['train']} train and {counts['val']} val captioned digits ({args.size}x{args.size} PNG) "
        f"as WebDataset shards under {args.out_dir}/{{train,val}}; train with data.format=webdataset "
        f"data.train_path={args.out_dir}/train data.val_path={args.out_dir}/val"
    )
    return 0


HELP = "dataset utilities (write the digits as an image folder, ...)"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "data",
        help=HELP,
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
    c = sub.add_parser(
        "digits-captions", help="write the digits as captioned WebDataset shards (CLIP)",
        description="Write scikit-learn's digits (train 1,497 / val 300) as WebDataset tar shards "
        "OUT_DIR/{train,val}/digits-NNNNNN.tar with <key>.png, <key>.txt (a caption such as 'a handwritten "
        "seven.' from several templates) and <key>.cls, plus OUT_DIR/classnames.txt.",
        formatter_class=DefaultsHelpFormatter,
    )  # fmt: skip
    c.add_argument("out_dir", metavar="OUT_DIR", help="folder to write (created if missing)")
    c.add_argument("--size", type=int, default=32, help="side of the written PNGs (bicubic upsampling; 8 = native)")
    c.add_argument("--shard-size", type=int, default=500, help="samples per shard")
    c.set_defaults(func=_digits_captions)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
