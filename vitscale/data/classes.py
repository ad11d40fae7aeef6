"""Class names and label checks shared by the formats.

``classnames.txt`` (one name per line, class ``i`` on line ``i``) beside a dataset — in the folder of
``data.train_path`` or its parent, local or remote — names the classes and fixes their order (also
for an image folder, whose class folders must then be among its names). Without it, shards and
tables take the class count from their labels: :func:`classes_from_labels` refuses labels that
cannot be class indices (negative) or are too sparse to be (a label of 999999999 among ten classes
would make a billion-way head), with a line saying what to set.
"""

from __future__ import annotations

import logging
import os
import posixpath

from ..errors import CheckError, UserError
from .files import read_regular

CLASSNAMES_FILE = "classnames.txt"


def _folder(path: str) -> str:
    head = path.split("{")[0].split("*")[0]
    if "://" in head:
        return head if head.endswith("/") else posixpath.dirname(head)
    return path if os.path.isdir(path) else os.path.dirname(head) or "."


def read_class_names(path: str | None) -> list[str] | None:
    """``classnames.txt`` in the folder of ``path`` (a folder, file, pattern, URL, or the file a ``pipe:``
    command reads) or its parent."""
    if not path:
        return None
    path = path.split("::")[0]
    if path.startswith("pipe:"):  # the command's last word naming a file: ``pipe:cat /data/train-{0..9}.tar``
        words = [w for w in path[len("pipe:"):].split() if "/" in w]
        if not words:
            return None
        path = words[-1]
    folder = _folder(path)
    join = posixpath.join if "://" in folder else os.path.join
    parent = (posixpath if "://" in folder else os.path).dirname(folder.rstrip("/"))
    for cand in (join(folder, CLASSNAMES_FILE), join(parent, CLASSNAMES_FILE)):
        text = _read_small(cand)
        if text is not None:
            return [line.strip() for line in text.splitlines() if line.strip()]
    return None


def _read_small(path: str) -> str | None:
    if "://" not in path:
        if not os.path.isfile(path):
            return None
        return read_regular(path).decode("utf-8")
    from .remote import RemoteOptions, open_stream

    try:
        with open_stream(path, RemoteOptions(retries=0, timeout_s=30)) as f:
            return f.read(1 << 24).decode("utf-8")
    except Exception:  # not there (404), not readable: no class names
        return None


def classes_from_labels(labels: list[int], where: str, num_classes: int | None = None) -> int:
    """The class count of integer ``labels`` (-1 = unlabelled, ignored): ``num_classes`` when given (every
    label must be below it), else ``max + 1`` when the labels are dense enough to be class indices.
    ``CheckError`` naming ``where`` otherwise."""
    seen = [y for y in labels if y != -1]
    if not seen:
        return num_classes or 0
    low, high = min(seen), max(seen)
    if low < 0:
        raise CheckError(f"{where}: label {low} is not a class index (labels are 0 .. num_classes-1)")
    if num_classes:
        if high >= num_classes:
            raise CheckError(f"{where}: label {high} is outside [0, {num_classes}) (the class count from "
                             f"classnames.txt / data.num_classes): fix the label or the class count")  # fmt: skip
        return num_classes
    distinct = len(set(seen))
    if high + 1 > 2 * distinct:
        raise CheckError(f"{where}: labels reach {high} but only {distinct} distinct values occur, so {high + 1} "
                         f"classes would be mostly empty: set data.num_classes or put a {CLASSNAMES_FILE} "
                         f"beside the data (or fix the label)")  # fmt: skip
    return high + 1


def write_run_class_names(folder, names: list[str]) -> None:
    """A run's class names (class ``i`` on line ``i``) in its folder: what ``vitscale eval`` maps the
    evaluation data's labels to and ``vitscale export`` names the outputs with. Written as the run's
    own file (docs/trust.md, "Symbolic links"): ``vitscale.safe_write.write_atomic``."""
    from pathlib import Path

    from ..safe_write import write_atomic

    write_atomic(Path(folder) / CLASSNAMES_FILE, "".join(f"{n}\n" for n in names))


def run_class_names(path) -> list[str] | None:
    """The class names of the run a checkpoint path belongs to (a run folder, its ``checkpoints/`` or a
    ``step_N`` in it, or a weights file in it): its ``classnames.txt``, or None."""
    from pathlib import Path

    if not path:
        return None
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    for d in (folder, folder.parent, folder.parent.parent):
        f = d / CLASSNAMES_FILE
        if f.is_symlink() and (d / "config.yaml").is_file():  # inside a run folder nothing is followed
            raise UserError(f"{f} is a symbolic link (to {os.readlink(f)}): nothing inside a run folder is followed "
                            f"(its files are its own, docs/trust.md); remove the link")  # fmt: skip
        if f.is_file() and (d / "config.yaml").is_file():
            return [line.strip() for line in read_regular(f).decode("utf-8").splitlines() if line.strip()]
    return None


def check_classes(model_classes: int | None, data_classes: int | None, where: str) -> None:
    """The model's class count (``model.num_classes`` as set; None: taken from the data) against the
    data's (``where``: the data's setting, for the message): a count smaller than the data's classes is
    an error naming both; a larger one, a warning (outputs no image is labelled with)."""
    if model_classes is None or not data_classes:
        return
    if model_classes < data_classes:
        raise CheckError(
            f"model.num_classes={model_classes} but the data has {data_classes} classes ({where}): leave "
            f"model.num_classes out to take the count from the data, or set it to at least {data_classes}"
        )
    if model_classes > data_classes:
        logging.getLogger("vitscale.run").warning(
            "model.num_classes=%d but the data has %d classes (%s): %d outputs of the head are never a label "
            "(leave model.num_classes out to take the count from the data)",
            model_classes, data_classes, where, model_classes - data_classes,
        )  # fmt: skip


__all__ = ["CLASSNAMES_FILE", "check_classes", "classes_from_labels", "read_class_names", "run_class_names", "write_run_class_names"]
