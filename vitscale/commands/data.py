"""``vitscale data …``: dataset utilities (one argparse subcommand each).

``vitscale data digits OUT_DIR`` writes scikit-learn's digits with the fixed train/val split as an
image folder: ``OUT_DIR/train/<class>/<n>.png`` and ``OUT_DIR/val/<class>/<n>.png``.
``vitscale data digits-captions OUT_DIR`` writes them as captioned WebDataset shards (CLIP).
``vitscale data inspect PATH`` reports what a dataset of any format holds (``vitscale.data.inspect``).
``vitscale data convert SRC OUT --to webdataset|parquet`` rewrites one (``vitscale.data.convert``).
"""

from __future__ import annotations

import argparse
import sys

from ..registry import COMMANDS
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


def _inspect(args) -> int:
    import json

    from vitscale.data.inspect import format_report, inspect_data

    cfg = _config(args.path, args.format, args.overrides)
    report = inspect_data(cfg, samples=args.samples, img_size=args.img_size)
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


def _config(path: str, fmt: str | None, overrides: list[str]):
    from vitscale.config import load_config
    from vitscale.data.inspect import detect_format

    fmt = fmt or detect_format(path)
    over = [o if o.startswith("data.") else f"data.{o}" for o in overrides]
    return load_config(None, [f"data.format={fmt}", f"data.train_path={path}", *over]).data


def _convert(args) -> int:
    import json

    from vitscale.data.convert import convert

    cfg = _config(args.src, args.format, args.overrides)
    summary = convert(cfg, args.out, args.to, prefix=args.prefix, max_count=args.max_count,
                      max_shard_mb=args.max_shard_mb, row_group=args.row_group, shuffle=args.shuffle,
                      seed=args.seed)  # fmt: skip
    print(json.dumps(summary, indent=1) if args.json else
          f"wrote {summary['samples']} samples ({summary['classes']} classes) of {args.src} as {args.to} to "
          f"{args.out}: {', '.join(summary['files'][:3])}{', ...' if len(summary['files']) > 3 else ''}"
          + (f"; {summary['skipped']} unreadable images left out" if summary["skipped"] else ""))  # fmt: skip
    return 0


HELP = "dataset utilities: the digits as files, inspect a dataset, convert between formats"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "data",
        help=HELP,
        description="Dataset utilities. `vitscale data digits OUT_DIR` writes scikit-learn's handwritten "
        "digits (fixed 1,497/300 split) as OUT_DIR/{train,val}/<class>/*.png; `vitscale data inspect PATH` "
        "reports what a dataset of any format holds; `vitscale data convert SRC OUT --to webdataset|parquet` "
        "rewrites one.",
    )
    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    d = sub.add_parser("digits", help="write the digits dataset as an image folder",
                       description="Write scikit-learn's digits (train 1,497 / val 300, stratified, seed 0) "
                       "as OUT_DIR/train/<class>/*.png and OUT_DIR/val/<class>/*.png, class folders zero ... "
                       "nine, and OUT_DIR/classnames.txt keeping them in digit order (the class names and "
                       "indices of data.format=digits).",
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
    i = sub.add_parser(
        "inspect", help="what a dataset holds: format, samples, classes, sample keys, decode speed",
        description="Read a dataset as a run would (its data.format, else the first format that recognises "
        "PATH) and report the format, the number of samples, the classes, a few sample keys and labels, "
        "what the format knows about it (shards, columns, ...) and the decode throughput of the first "
        "images, so a dataset can be checked before a long run. key=value: data fields of the format "
        "(e.g. label_key=json.label).",
        formatter_class=DefaultsHelpFormatter,
        epilog="Example: vitscale data inspect digits/train\n"
        "         vitscale data inspect 'shards/train-{000000..000002}.tar' --format webdataset\n"
        "         vitscale data inspect s3://bucket/imagenet/train --format parquet --json",
    )  # fmt: skip
    i.add_argument("path", metavar="PATH", help="a folder, file, glob, brace pattern or URL, as data.train_path")
    i.add_argument("overrides", nargs="*", metavar="key=value", help="data fields (data. prefix optional)")
    i.add_argument("--format", help="the data.format (default: detected from PATH)")
    i.add_argument("--samples", type=int, default=64, help="images decoded to time the decode")
    i.add_argument("--img-size", type=int, default=224, help="side of the decoded images")
    i.add_argument("--json", action="store_true", help="print the report as JSON")
    i.set_defaults(func=_inspect)
    v = sub.add_parser(
        "convert", help="rewrite a dataset as WebDataset shards or Parquet files",
        description="Read SRC (any format: an image folder, shards, Parquet, CSV; detected unless --format is "
        "given) and write its images as they are stored, with their labels (and captions), in a random order "
        "keyed by --seed (streaming readers shuffle only within a buffer; --no-shuffle keeps SRC's order), to OUT: "
        "--to webdataset writes OUT/<prefix>-NNNNNN.tar with <key>.<ext> + <key>.cls (+ <key>.txt); --to "
        "parquet writes OUT/<prefix>-NNNNN.parquet with image ({bytes, path}), label (+ caption) and key "
        "columns. OUT/classnames.txt lists the classes. Convert each split (train, val) on its own. "
        "key=value: data fields of SRC's format.",
        formatter_class=DefaultsHelpFormatter,
        epilog="Example: vitscale data digits digits && vitscale data convert digits/train wds/train --to webdataset --max-count 500\n"
        "         vitscale data convert digits/val pq/val --to parquet",
    )  # fmt: skip
    v.add_argument("src", metavar="SRC", help="the data to read, as data.train_path")
    v.add_argument("out", metavar="OUT", help="folder to write (created if missing)")
    v.add_argument("overrides", nargs="*", metavar="key=value", help="data fields of SRC's format")
    v.add_argument("--to", required=True, choices=("webdataset", "parquet"), help="the format to write")
    v.add_argument("--format", help="SRC's data.format (default: detected)")
    v.add_argument("--prefix", help="file name prefix (default: SRC's last name, e.g. train)")
    v.add_argument("--max-count", type=int, default=10_000, help="webdataset: samples per shard at most")
    v.add_argument("--max-shard-mb", type=float, default=1024.0, help="MiB per shard / file at most")
    v.add_argument("--row-group", type=int, default=100, help="parquet: rows per row group")
    v.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True,
                   help="write the samples in a random order keyed by --seed")
    v.add_argument("--seed", type=int, default=0, help="the key of the order")
    v.add_argument("--json", action="store_true", help="print the summary as JSON")
    v.set_defaults(func=_convert)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


COMMANDS.register("data", sys.modules[__name__])
