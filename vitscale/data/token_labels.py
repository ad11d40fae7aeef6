"""Dense token labels on disk (token labeling, Jiang et al. 2021) and their alignment with augmentations.

Layout of a label folder (written by ``vitscale label-tokens``)::

    token_labels.json             {"format": "topk_logits", "version": 2, "splits": {"train": {"num_samples",
                                  "grid", "topk", ...}}, "num_classes", ...}
    train.values.f16              float16 (N, k, gh, gw): the teacher's top-k logits per location
    train.indices.i16             int16   (N, k, gh, gw): their class indices
    train.cls_values.f16          float16 (N, k): the teacher's top-k class-token logits
    train.cls_indices.i16         int16   (N, k)
    train.boxes.f32               float32 (N, 4): the part of the original image the teacher saw
                                  (top, left, h, w fractions; (0, 0, 1, 1) unless a center crop cut it)
    train.labels.i32              int32   (N,): the class label of the sample labelled on row i (-1: none),
                                  checked against the batch's labels whenever a row is read
    train.keys.json               (shards) a JSON list: the sample key of row i at position i (JSON
                                  escapes every character, so no key -- U+2028, a line break -- can
                                  shift a row); keys are unique across every shard of the split

Row ``i`` belongs to sample ``i`` of the split (the batches' ``"index"``); for data with sample keys
(WebDataset shards) the rows are found by key (the batches' ``"key"``), so a run that streams
the shards, in any order, finds each sample's labels; a batch's sample is checked against the row it
reads (its key is the row's key; labels keyed by sample are never read by index, nor unkeyed labels
for keyed samples). Raw little-endian arrays
read through ``numpy.memmap``: no pickle, random access per batch, 20 bytes per location for k=5
(ImageNet at 14x14 and k=5: ~5 GB).

The maps cover the whole original image (the teacher saw it resized, uncropped). Logits, as
TokenLabeling's ``generate_label.py`` stores them: the targets are made from them by
:mod:`vitscale.data.token_label_targets` (the reference's formulas). A folder an older vitscale wrote
(top-k softmax scores, no ``"format"`` in ``token_labels.json``) is refused in one line: run
``vitscale label-tokens`` again.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from vitscale.errors import CheckError

from .files import require_regular

META_FILE = "token_labels.json"
FORMAT, VERSION = "topk_logits", 2
"""What ``token_labels.json`` says the arrays hold: the teacher's top-k logits (version 1, no field:
softmax scores)."""


def unique_keys(keys: list[str], places: list[str] | None = None, what: str = "the data") -> dict[str, int]:
    """``{key: row}``; a key held by two samples is refused in one line naming both places (the
    shards, ``places[i]`` for sample ``i``): their labels could not be told apart."""
    rows: dict[str, int] = {}
    for i, k in enumerate(keys):
        j = rows.setdefault(k, i)
        if j != i:
            where = (f"{places[j]} and {places[i]}" if places is not None else f"rows {j} and {i}")
            raise CheckError(f"{what}: sample key {k!r} is held by two samples ({where}): token labels are found "
                             "by sample key, so keys must be unique across every shard; rename one")  # fmt: skip
    return rows


def _files(root: Path, split: str) -> dict[str, Path]:
    return {
        "values": root / f"{split}.values.f16",
        "indices": root / f"{split}.indices.i16",
        "cls_values": root / f"{split}.cls_values.f16",
        "cls_indices": root / f"{split}.cls_indices.i16",
        "boxes": root / f"{split}.boxes.f32",
        "keys": root / f"{split}.keys.json",
        "labels": root / f"{split}.labels.i32",
    }


class TokenLabelWriter:
    """Writes one split's dense top-k maps, row by sample index; ``close()`` checks every row was written.

    On several processes (``torchrun … vitscale label-tokens``) every rank opens one writer on the same
    files: rank 0 creates them at their full size, the others open them once it has, each rank
    writes the rows of its samples (disjoint: each sample is labelled by one rank), and ``close()``
    checks that the ranks' rows add up to the split before rank 0 writes ``token_labels.json``.
    ``writes=False``: a rank that labels the same samples as another (a tensor-parallel peer) and
    writes nothing.
    """

    def __init__(self, root: str | Path, split: str, num_samples: int, grid: tuple[int, int], topk: int,
                 num_classes: int, info: dict | None = None, *, writes: bool = True,
                 keys: list[str] | None = None):  # fmt: skip
        if num_classes > np.iinfo(np.int16).max:
            raise ValueError(f"{num_classes} classes do not fit the int16 index format")
        self.root, self.split = Path(root), split
        self.n, self.grid, self.topk, self.num_classes = num_samples, tuple(grid), topk, num_classes
        self.info = info or {}
        self.writes = writes
        self.keys = list(keys) if keys is not None else None  # the sample key of every row (shards)
        self.rank = _rank()
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
        self._open("w+" if self.rank == 0 else None)  # rank 0 preallocates the files
        _barrier()
        if self.rank != 0:
            self._open("r+")  # the others map the files rank 0 made
        self.written = np.zeros(num_samples, dtype=bool)

    def _open(self, mode: str | None) -> None:
        if mode is None:
            return
        f = _files(self.root, self.split)
        shape = (self.n, self.topk, *self.grid)
        self.values = np.memmap(f["values"], np.float16, mode, shape=shape)
        self.indices = np.memmap(f["indices"], np.int16, mode, shape=shape)
        self.cls_values = np.memmap(f["cls_values"], np.float16, mode, shape=(self.n, self.topk))
        self.cls_indices = np.memmap(f["cls_indices"], np.int16, mode, shape=(self.n, self.topk))
        self.boxes = np.memmap(f["boxes"], np.float32, mode, shape=(self.n, 4))
        self.labels = np.memmap(f["labels"], np.int32, mode, shape=(self.n,))

    def write(self, index: torch.Tensor, token_logits: torch.Tensor, cls_logits: torch.Tensor,
              boxes: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> None:  # fmt: skip
        """``index`` (B,); ``token_logits`` (B, gh, gw, C) and ``cls_logits`` (B, C) the teacher's logits;
        ``boxes`` (B, 4) the teacher's view of each image (None = the whole image); ``labels`` (B,) the
        samples' class labels (None: -1, not checked). Rows of padding samples (index -1) are not written."""
        if not self.writes:
            return
        keep = index.cpu() >= 0
        idx = index.cpu()[keep].numpy()
        if boxes is None:
            boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0]]).expand(len(keep), 4)
        keep_d = keep.to(token_logits.device)
        token_logits, cls_logits, boxes = token_logits[keep_d], cls_logits[keep_d], boxes.cpu()[keep]
        self.boxes[idx] = boxes.float().numpy()
        self.labels[idx] = labels.cpu()[keep].numpy().astype(np.int32) if labels is not None else -1
        v, i = token_logits.float().topk(self.topk, dim=-1)  # (B, gh, gw, k)
        self.values[idx] = v.permute(0, 3, 1, 2).cpu().numpy().astype(np.float16)
        self.indices[idx] = i.permute(0, 3, 1, 2).cpu().numpy().astype(np.int16)
        cv, ci = cls_logits.float().topk(self.topk, dim=-1)
        self.cls_values[idx] = cv.cpu().numpy().astype(np.float16)
        self.cls_indices[idx] = ci.cpu().numpy().astype(np.int16)
        self.written[idx] = True

    def close(self) -> dict:
        for a in (self.values, self.indices, self.cls_values, self.cls_indices, self.boxes, self.labels):
            a.flush()
        done = _sum_over_ranks(int(self.written.sum()))  # the ranks' rows are disjoint
        if done != self.n:
            raise RuntimeError(f"{self.n - done} of {self.n} samples of {self.split!r} got no labels")
        meta: dict = {}
        if self.rank == 0:
            meta_path = self.root / META_FILE
            meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {"splits": {}}
            if meta.get("format") != FORMAT:  # splits of an older format are not kept beside this one
                meta["splits"] = {}
            meta.update({"format": FORMAT, "version": VERSION})
            meta["num_classes"] = self.num_classes
            meta.update({k: v for k, v in self.info.items() if k != "splits"})
            meta["splits"][self.split] = {"num_samples": self.n, "grid": list(self.grid), "topk": self.topk,
                                          "labels": _files(self.root, self.split)["labels"].name}  # fmt: skip
            if self.keys is not None:
                keys_path = _files(self.root, self.split)["keys"]
                keys_path.write_text(json.dumps(self.keys))  # ASCII: every other character escaped
                meta["splits"][self.split]["keys"] = keys_path.name
            meta_path.write_text(json.dumps(meta, indent=1))
        _barrier()  # the split is complete on disk before any rank goes on
        return meta


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _sum_over_ranks(n: int) -> int:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return n
    t = torch.tensor([n], dtype=torch.int64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    return int(t.item())


class TokenLabelStore:
    """Read-only access to one split of a label folder."""

    format = "vitscale"  # with the teacher's class-token top-k (token_label.cls_target=teacher)

    def __init__(self, root: str | Path, split: str = "train"):
        self.root = Path(root)
        meta_path = self.root / META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(f"no token labels at {self.root} (missing {META_FILE}); run `vitscale label-tokens`")
        self.meta = json.loads(meta_path.read_text())
        if self.meta.get("format") != FORMAT:
            raise CheckError(f"token labels at {self.root} hold the top-k softmax scores an older vitscale wrote (its "
                             f"{META_FILE} has no \"format\": \"{FORMAT}\"): run `vitscale label-tokens` again")  # fmt: skip
        if split not in self.meta["splits"]:
            raise KeyError(f"token labels at {self.root} have no split {split!r} ({sorted(self.meta['splits'])})")
        s = self.meta["splits"][split]
        self.num_samples, self.grid, self.topk = s["num_samples"], tuple(s["grid"]), s["topk"]
        self.num_classes = self.meta["num_classes"]
        f = _files(self.root, split)
        require_regular(f.values())  # np.memmap would block forever opening a FIFO
        shape = (self.num_samples, self.topk, *self.grid)
        self.values = np.memmap(f["values"], np.float16, "r", shape=shape)
        self.indices = np.memmap(f["indices"], np.int16, "r", shape=shape)
        self.cls_values = np.memmap(f["cls_values"], np.float16, "r", shape=(self.num_samples, self.topk))
        self.cls_indices = np.memmap(f["cls_indices"], np.int16, "r", shape=(self.num_samples, self.topk))
        self.boxes = np.memmap(f["boxes"], np.float32, "r", shape=(self.num_samples, 4))
        self.labels = None  # older label folders hold no labels: their rows are not checked
        if s.get("labels"):
            require_regular([f["labels"]])
            self.labels = np.memmap(f["labels"], np.int32, "r", shape=(self.num_samples,))
        self._keys_file = (self.root / Path(s["keys"]).name) if s.get("keys") else None
        if self._keys_file is not None and self._keys_file.name != f["keys"].name:
            raise CheckError(f"token labels at {self.root}: {self._keys_file.name} is a line-per-key file an older "
                             "vitscale wrote (a key holding a line break shifts every later row): run "
                             "`vitscale label-tokens` again")  # fmt: skip
        self._rows: dict[str, int] | None = None

    def __len__(self) -> int:
        return self.num_samples

    def rows(self, index: torch.Tensor, keys: list[str] | None = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """The label rows of a batch: by sample key when the labels and the batch have keys (shards,
        streamed in any order), else the batch's dataset index; each row checked against its sample's
        class label (``labels``, host tensor) when the folder holds the labels it was made from."""
        rows = self._rows_of(index, keys)
        if labels is not None and self.labels is not None:
            self.check(rows, labels, keys)
        return rows

    def check(self, rows: torch.Tensor, labels: torch.Tensor, keys: list[str] | None = None) -> None:
        """A one-line :class:`CheckError` when a row was made from an image of another class than the
        sample that reads it (labels made from other data, keys edited, rows shifted)."""
        r = np.asarray(rows.detach().cpu().numpy(), dtype=np.int64)
        if r.size and (r.min() < 0 or r.max() >= self.num_samples):
            raise CheckError(f"token labels at {self.root}: sample row out of range for {self.num_samples} rows: made "
                             "from other data? run `vitscale label-tokens` on this data")  # fmt: skip
        want = np.asarray(self.labels[r])
        got = labels.detach().cpu().numpy().astype(np.int64)
        bad = np.flatnonzero((want >= 0) & (got >= 0) & (want != got))
        if bad.size:
            j = int(bad[0])
            who = f"sample {keys[j]!r}" if keys is not None else f"sample {int(r[j])}"
            raise CheckError(f"token labels at {self.root}: {who} (class {int(got[j])}) reads row {int(r[j])}, made from "
                             f"an image of class {int(want[j])}: the labels are not this data's (made from other data, "
                             "or their files edited); run `vitscale label-tokens` on this data")  # fmt: skip

    def _rows_of(self, index: torch.Tensor, keys: list[str] | None) -> torch.Tensor:
        if self._keys_file is None:
            if keys is not None:
                raise CheckError(f"token labels at {self.root} are by sample index, but the data gives sample keys "
                                 "(shards streamed, in any order): label the data with `vitscale label-tokens` in "
                                 "data.webdataset_mode=index to key them")  # fmt: skip
            return index
        if keys is None:
            raise CheckError(f"token labels at {self.root} are keyed by sample (shards) but the data gives no sample "
                             "keys: train on the data they were made from")  # fmt: skip
        if self._rows is None:
            self._rows = self._read_keys()
        try:
            return torch.tensor([self._rows[k] for k in keys], dtype=torch.long)
        except KeyError as e:
            raise KeyError(f"sample {e.args[0]!r} has no token labels in {self.root} (labelled from other data?)") from None

    def _read_keys(self) -> dict[str, int]:
        require_regular([self._keys_file])
        where = f"token labels at {self.root}: {self._keys_file.name}"
        try:
            keys = json.loads(self._keys_file.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise CheckError(f"{where} is not JSON ({e}): run `vitscale label-tokens` again") from None
        if not isinstance(keys, list) or len(keys) != self.num_samples or not all(isinstance(k, str) for k in keys):
            n = len(keys) if isinstance(keys, list) else type(keys).__name__
            raise CheckError(f"{where} must list {self.num_samples} sample keys (strings), one per row; it holds "
                             f"{n}: run `vitscale label-tokens` again")  # fmt: skip
        return unique_keys(keys, what=where)

    def topk_maps(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k logits ``(B, k, gh, gw)`` float32 and class indices ``(B, k, gh, gw)`` int64."""
        idx = np.asarray(index.detach().cpu().numpy(), dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_samples):
            raise IndexError(f"sample index out of range for {self.num_samples} token-label rows")
        v = torch.from_numpy(np.ascontiguousarray(self.values[idx])).float()
        i = torch.from_numpy(np.ascontiguousarray(self.indices[idx])).long()
        return v, i

    def view_boxes(self, index: torch.Tensor, device=None) -> torch.Tensor:
        """The teacher's view ``(B, 4)`` (top, left, h, w fractions of the original image)."""
        idx = np.asarray(index.detach().cpu().numpy(), dtype=np.int64)
        return _to(torch.from_numpy(np.ascontiguousarray(self.boxes[idx])), device)

    def cls_topk(self, index: torch.Tensor, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's class-token top-k logits ``(B, k)`` float32 and class indices ``(B, k)`` int64."""
        idx = np.asarray(index.detach().cpu().numpy(), dtype=np.int64)
        v = _to(torch.from_numpy(np.ascontiguousarray(self.cls_values[idx])).float(), device)
        i = _to(torch.from_numpy(np.ascontiguousarray(self.cls_indices[idx])).long(), device)
        return v, i


def _to(t: torch.Tensor, device) -> torch.Tensor:
    """Host rows to the training device without waiting for it (a blocking host-to-GPU copy
    synchronises the stream; from pageable memory a non-blocking one is staged at once)."""
    return t if device is None else t.to(device, non_blocking=True)


__all__ = ["FORMAT", "META_FILE", "TokenLabelStore", "TokenLabelWriter", "unique_keys"]
