"""TokenLabeling's label folders: one PyTorch file per training image (the published NFNet-F6 maps
the VOLO and LV-ViT papers trained with, or any folder TokenLabeling's ``generate_label.py`` wrote).

Layout (github.com/zihangJiang/TokenLabeling ``tlt/data/dataset.py`` lines 88-93, ``generate_label.py``
lines 264-272): ``<root>/<class folder>/<image file name up to its first dot>.pt`` holding a
``[2, k, H, W]`` tensor (half): ``[0]`` the teacher's top-k logits at every location of the
whole image, ``[1]`` their class indices (integers stored as floats). A sample of an image folder
finds its file by its class folder (the image's parent folder) and name, as ``dataset.py`` does.

Every file is read by the one bounded reader (``vitscale.interop.pretrained.read_pickle``:
``torch.load(weights_only=True)``, no code runs from it, a view over fewer bytes than it claims refused) when its sample is
loaded — in the DataLoader workers (:class:`WithLabelFiles`: a batch's ``"token_label_maps"``), so the
training process never waits for them; a file that is not such a tensor — another kind of object, another shape or dtype, class
indices outside ``[0, C)``, a map of another size than the folder's first — is refused in one line
naming it. The maps cover the whole image, as the reference assumes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from vitscale.errors import CheckError

FORMAT = "tokenlabeling"


def looks_like(root: str | Path) -> bool:
    """A folder of class folders holding ``.pt`` files (TokenLabeling's layout)."""
    try:
        for d in sorted(os.scandir(root), key=lambda e: e.name):
            if d.is_dir():
                return any(e.name.endswith(".pt") for e in os.scandir(d.path))
    except OSError:
        return False
    return False


def label_file(root: Path, image_path: str) -> Path:
    """``<root>/<class folder>/<name up to its first dot>.pt`` of an image (a path or a URL)."""
    parts = str(image_path).replace("\\", "/").rstrip("/").split("/")
    if len(parts) < 2:
        raise CheckError(f"token_label.path={root}: image {image_path!r} is not in a class folder, so it has no "
                         "<class>/<image>.pt label file")  # fmt: skip
    return root / parts[-2] / (parts[-1].split(".")[0] + ".pt")


def label_format(root: str | Path, given: str = "auto") -> str:
    """``vitscale`` or ``tokenlabeling``: ``given``, or for ``auto`` what the folder holds (a
    ``token_labels.json``, or class folders of ``.pt`` files); none of them: one line."""
    from .token_labels import META_FILE

    if given != "auto":
        return given
    if (Path(root) / META_FILE).is_file():
        return "vitscale"
    if looks_like(root):
        return FORMAT
    raise CheckError(f"token_label.path={root} holds no token labels: neither a {META_FILE} (`vitscale label-tokens`) "
                     "nor class folders of <image>.pt files (TokenLabeling's label folders)")  # fmt: skip


class LabelFileFolder:
    """Reads the top-k maps of a batch from a TokenLabeling folder; rows are dataset indices into
    ``paths`` (the training images, :meth:`bind`)."""

    format = FORMAT  # the files hold no class-token prediction (token_label.cls_target=teacher)

    def __init__(self, root: str | Path, num_classes: int):
        self.root = Path(root)
        if not self.root.is_dir():
            raise CheckError(f"token_label.path={root} is not a folder")
        self.num_classes = num_classes
        self.paths: list[str] | None = None
        self.shape: tuple[int, ...] | None = None  # (k, H, W), from the first file read

    def bind(self, paths: list[str]) -> None:
        """The training images, by dataset index."""
        self.paths = list(paths)

    def read(self, path: Path) -> torch.Tensor:
        """One file as ``(2, k, H, W)`` float32, checked (module docstring)."""
        where = f"token label file {path}"
        if not path.is_file():
            raise CheckError(f"{where} does not exist: the label folder (token_label.path) has no file for this "
                             "training image (<class>/<image name>.pt)")  # fmt: skip
        from vitscale.errors import UserError
        from vitscale.interop.pretrained import read_pickle  # the one bounded reader of a pickle

        try:
            t = read_pickle(path, where)  # a stride-0 view is refused before any value is read (16 GB once)
        except UserError as e:
            raise CheckError(f"{e}: TokenLabeling's files hold one [2, k, H, W] half tensor") from None
        except Exception as e:  # noqa: BLE001 - any unreadable file is the same one-line refusal
            raise CheckError(f"{where} is not a tensor file torch.load(weights_only=True) reads "
                             f"({type(e).__name__}): TokenLabeling's files hold one [2, k, H, W] half tensor") from None  # fmt: skip
        if not isinstance(t, torch.Tensor):
            raise CheckError(f"{where} holds a {type(t).__name__}, not a tensor: TokenLabeling's files hold one "
                             "[2, k, H, W] half tensor")  # fmt: skip
        if t.ndim != 4 or t.shape[0] != 2 or 0 in t.shape:
            raise CheckError(f"{where} holds a tensor of shape {list(t.shape)}, not [2, k, H, W] (top-k logits and "
                             "their class indices)")  # fmt: skip
        if t.dtype not in (torch.float16, torch.float32):
            raise CheckError(f"{where} holds {t.dtype}, not float16 (TokenLabeling's half tensors)")
        if self.shape is None:
            self.shape = tuple(t.shape[1:])
        elif tuple(t.shape[1:]) != self.shape:
            raise CheckError(f"{where} holds a [2, {', '.join(map(str, t.shape[1:]))}] map where the folder's others "
                             f"are [2, {', '.join(map(str, self.shape))}]: every file must have the same k, H, W")  # fmt: skip
        t = t.float()
        idx = t[1]
        if not torch.isfinite(t[0]).all() or (idx != idx.round()).any() or idx.min() < 0 or idx.max() >= self.num_classes:
            raise CheckError(f"{where}: class indices must be integers in [0, {self.num_classes}) and logits finite "
                             f"(a label folder of another dataset or class count?)")  # fmt: skip
        return t

    def rows(self, index: torch.Tensor, keys: list[str] | None = None, labels=None) -> torch.Tensor:
        """The batch's dataset indices (a file is found by its image's class folder and name)."""
        return index

    def topk_maps(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k logits ``(B, k, H, W)`` float32 and class indices ``(B, k, H, W)`` int64."""
        if self.paths is None:
            raise RuntimeError("LabelFileFolder.bind(paths) was not called")
        idx = np.asarray(index.detach().cpu().numpy(), dtype=np.int64)
        maps = torch.stack([self.read(label_file(self.root, self.paths[i])) for i in idx.tolist()])
        return maps[:, 0], maps[:, 1].long()

    def view_boxes(self, index: torch.Tensor, device=None) -> None:
        """The maps cover the whole image."""
        return None


class WithLabelFiles:
    """A file source whose samples also carry their label file's maps (``extra["token_label_maps"]``,
    ``(2, k, H, W)`` float32), read where the sample is loaded (a DataLoader worker). A refused file
    travels as ``extra["token_label_error"]`` (its one line), raised by the task in the training
    process: an error raised in a worker would reach the user wrapped in the worker's traceback."""

    def __init__(self, source, folder: LabelFileFolder):
        self.source, self.folder = source, folder

    def __len__(self) -> int:
        return len(self.source)

    def __getattr__(self, name):  # paths, keys, raw(), leave_out_bad, ...: the source's own
        if name in ("source", "folder"):
            raise AttributeError(name)
        return getattr(self.source, name)

    def sample(self, index: int, epoch: int, tf):
        s = self.source.sample(index, epoch, tf)
        try:
            maps, error = self.folder.read(label_file(self.folder.root, self.source.paths[s.index])), ""
        except CheckError as e:
            maps, error = torch.zeros(2, *(self.folder.shape or (1, 1, 1))), str(e)
        s.extra = {**s.extra, "token_label_maps": maps, "token_label_error": error}
        return s


__all__ = ["FORMAT", "LabelFileFolder", "WithLabelFiles", "label_file", "label_format", "looks_like"]
