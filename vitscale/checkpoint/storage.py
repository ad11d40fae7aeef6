"""The checkpoint format: a storage writer/reader pair for torch.distributed.checkpoint (DCP) that
stores tensors in safetensors files and everything else as JSON — nothing is pickled.

DCP keeps doing what it is good at: planning which rank writes which shard of which tensor, and on
load, which bytes each rank needs for *its* layout (resharding across world sizes, FSDP, TP). This
pair replaces only the storage, whose stock version pickles its index (``.metadata``) and may call
``torch.load`` on data bytes. One checkpoint folder::

    checkpoint.json                index (rank 0): every tensor's dtype, global shape and chunks, each
                                   chunk's file and byte range; the manifests to expect. Sealed.
    files-rank00000.json ...       manifest of each rank: size and XXH3-64 of every file that rank
                                   wrote. Sealed (its own checksum inside).
    model-rank00000.safetensors    that rank's chunks of the ``model`` tensors (also ``optim``, ``ema``)
    trainer_state.json             step, data position (rank 0)
    rng_rank00000.json ...         each rank's RNG states

"Sealed": the JSON carries a checksum of its own content (``integrity.seal_json``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import StorageReader, StorageWriter
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .finite import scan_file
from .geometry import cover_problem, shape_problem, spans_problem
from .integrity import (
    HASH_NAME,
    CheckpointError,
    CorruptFile,
    check_name,
    member,
    open_member,
    read_sealed_json,
    seal_json,
    write_file,
)
from .safetensors_io import _read_exact, byte_view, dtype_code, dtype_from_code, nbytes, write_safetensors

INDEX = "checkpoint.json"
FORMAT = "vitscale-checkpoint"
VERSION = 1
MAX_INDEX_BYTES = 1 << 30  # ~ a million chunks
MAX_JSON_BYTES = 64 << 20  # manifests, trainer state, RNG states


def manifest_name(rank: int) -> str:
    return f"files-rank{rank:05d}.json"


def _chunk_name(fqn: str, offsets) -> str:
    """The chunk's name inside its safetensors file: the key, plus its offsets when it is a shard."""
    return fqn if not any(offsets) else f"{fqn}@{','.join(str(int(o)) for o in offsets)}"


# ------------------------------------------------------------------------------------- writing
class SafetensorsWriter(StorageWriter):
    """Each rank writes its chunks, one safetensors file per top-level key, plus ``extra_files``
    (its RNG / trainer state JSON) and its manifest; the coordinator writes the index last."""

    def __init__(self, path: str | Path, rank: int, extra_files: dict[str, bytes] | None = None):
        super().__init__()
        self.path, self.rank, self.extra_files = Path(path), rank, dict(extra_files or {})

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:  # would need pickling: refused at planning time
                raise CheckpointError(f"only tensors go into a checkpoint; {item.index.fqn!r} is not a tensor")
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        groups: dict[str, list] = {}
        for item in plan.items:
            groups.setdefault(item.index.fqn.split(".", 1)[0], []).append(item)
        files: dict[str, dict] = {}
        results = []
        for key, items in groups.items():
            name = f"{key}-rank{self.rank:05d}.safetensors"
            check_name(self.path, name)  # a top-level key the reader would refuse is refused here
            entries = [
                (_chunk_name(it.index.fqn, it.tensor_data.chunk.offsets), it.tensor_data.properties.dtype,
                 tuple(it.tensor_data.chunk.sizes), (lambda it=it: planner.resolve_data(it)))
                for it in items
            ]  # fmt: skip
            size, checksum, spans = write_safetensors(self.path / name, entries, {"format": FORMAT}, embed_checksum=False)
            files[name] = {"bytes": size, HASH_NAME: checksum}
            for it, (entry, *_rest) in zip(items, entries):
                start, length = spans[entry]
                results.append(WriteResult(index=it.index, size_in_bytes=length, storage_data=(name, start, length)))
        for name, data in self.extra_files.items():
            size, checksum = write_file(self.path / name, data)
            files[name] = {"bytes": size, HASH_NAME: checksum}
        write_file(self.path / manifest_name(self.rank), seal_json({"rank": self.rank, "files": files}))
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        locs = {(wr.index.fqn, tuple(wr.index.offset or ())): wr.storage_data for rank_results in results for wr in rank_results}
        tensors = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if not isinstance(md, TensorStorageMetadata):
                raise CheckpointError(f"only tensors go into a checkpoint; {fqn!r} is not a tensor")
            chunks = []
            for c in md.chunks:
                file, start, length = locs[(fqn, tuple(c.offsets))]
                chunks.append({"offsets": list(c.offsets), "sizes": list(c.sizes), "file": file, "start": start, "length": length})
            tensors[fqn] = {"dtype": dtype_code(md.properties.dtype), "shape": list(md.size), "chunks": chunks}
        paths = {fqn: list(p) for fqn, p in (metadata.planner_data or {}).items()}
        world = len(results)
        index = {"format": FORMAT, "version": VERSION, "world_size": world, "hash": HASH_NAME,
                 "manifests": [manifest_name(r) for r in range(world)], "tensors": tensors, "paths": paths}  # fmt: skip
        write_file(self.path / INDEX, seal_json(index))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True


# ------------------------------------------------------------------------------------- the index
def _ints(x, n: int | None = None) -> bool:
    return (
        isinstance(x, list)
        and (n is None or len(x) == n)
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62 for v in x)
    )


def read_index(path: Path) -> dict:
    """The checkpoint's index, its seal and every field checked (:class:`CorruptFile` if not): no
    shape overflows, each chunk's byte length matches its shape, and the chunks of a tensor tile it
    exactly — inside it, disjoint, covering every element (:mod:`vitscale.checkpoint.geometry`), so
    what a reader allocates is bounded by what is on disk and every element it hands out was read."""
    f = member(path, INDEX)
    idx = read_sealed_json(f, MAX_INDEX_BYTES)

    def bad(why: str):
        return CorruptFile(f, why)

    if idx.get("format") != FORMAT:
        raise bad(f"not a vitscale checkpoint index (format {str(idx.get('format'))[:40]!r})")
    if idx.get("version") != VERSION:
        raise bad(f"format version {str(idx.get('version'))[:20]}, this vitscale reads version {VERSION} (a newer vitscale wrote it?)")
    world = idx.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or not 1 <= world <= 1 << 20:
        raise bad("world_size is not a positive integer")
    if idx.get("manifests") != [manifest_name(r) for r in range(world)]:
        raise bad("the manifest list does not match world_size")
    tensors = idx.get("tensors")
    if not isinstance(tensors, dict):
        raise bad("no tensor table")
    for fqn, t in tensors.items():
        if not isinstance(t, dict) or dtype_from_code(t.get("dtype")) is None or not _ints(t.get("shape")):
            raise bad(f"tensor {fqn[:80]!r}: malformed dtype or shape")
        shape, dtype = t["shape"], dtype_from_code(t["dtype"])
        why = shape_problem(shape, dtype.itemsize)
        if why:
            raise bad(f"tensor {fqn[:80]!r}: {why}")
        chunks = t.get("chunks")
        if not isinstance(chunks, list) or not chunks:
            raise bad(f"tensor {fqn[:80]!r}: no chunks")
        for c in chunks:
            if not isinstance(c, dict) or not _ints(c.get("offsets"), len(shape)) or not _ints(c.get("sizes"), len(shape)):
                raise bad(f"tensor {fqn[:80]!r}: malformed chunk")
            if not isinstance(c.get("file"), str) or not _ints([c.get("start"), c.get("length")]):
                raise bad(f"tensor {fqn[:80]!r}: malformed chunk location")
            check_name(path, c["file"])
            if c["length"] != nbytes(c["sizes"], dtype):
                raise bad(f"tensor {fqn[:80]!r}: a chunk of {c['length']} bytes for sizes {c['sizes'][:8]}")
        why = cover_problem(shape, [(c["offsets"], c["sizes"]) for c in chunks])
        if why:
            raise bad(f"tensor {fqn[:80]!r}: {why}")
    paths = idx.get("paths", {})
    if not isinstance(paths, dict) or not all(
        isinstance(p, list) and p and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in p) for p in paths.values()
    ):
        raise bad("malformed key paths")
    return idx


def read_manifests(path: Path, idx: dict) -> dict[str, dict]:
    """``{file name: {"bytes", "xxh3_64", "rank"}}`` from every rank's manifest (each seal checked)."""
    files: dict[str, dict] = {}
    for rank, name in enumerate(idx["manifests"]):
        f = member(path, name)
        man = read_sealed_json(f, MAX_JSON_BYTES)
        if man.get("rank") != rank or not isinstance(man.get("files"), dict):
            raise CorruptFile(f, "malformed manifest")
        for fname, info in man["files"].items():
            if not isinstance(info, dict) or not _ints([info.get("bytes")]) or not isinstance(info.get(HASH_NAME), str):
                raise CorruptFile(f, f"malformed entry for {fname[:80]!r}")
            if fname in files:
                raise CorruptFile(f, f"lists {fname[:80]!r}, which rank {files[fname]['rank']} also lists")
            check_name(path, fname)
            files[fname] = {**info, "rank": rank}
    spans: dict[str, list[tuple[int, int]]] = {}
    for fqn, t in idx["tensors"].items():
        for c in t["chunks"]:
            info = files.get(c["file"])
            if info is None:
                raise CorruptFile(path / str(c["file"])[:80], "holds tensor data but no manifest lists it")
            if c["start"] + c["length"] > info["bytes"]:
                raise CorruptFile(path / c["file"], f"a chunk reaches past the end of the file (tensor {fqn[:80]!r})")
            spans.setdefault(c["file"], []).append((c["start"], c["length"]))
    for name, file_spans in spans.items():
        why = spans_problem(file_spans)
        if why:
            raise CorruptFile(path / name, why)
    return files


def verify(path: Path, *, keys: set[str] | None = None, share: tuple[int, int] = (0, 1), need: tuple[str, ...] = ()) -> tuple[dict | None, list[str]]:
    """Check one checkpoint folder: index, manifests, then each file's size and checksum, and in the
    same read that its floating tensors are finite (:func:`vitscale.checkpoint.finite.scan_file`).

    ``keys``: only the files holding these top-level keys (e.g. ``{"model"}``) and ``need``; default
    every file. ``share=(rank, world)``: this process checksums every world-th file (the others the
    rest); sizes are checked by all. Returns (index or None, problems as "path: reason")."""
    try:
        idx = read_index(path)
        files = read_manifests(path, idx)
    except CorruptFile as e:
        return None, [str(e)]
    problems = []
    for name in need:
        if name not in files:
            problems.append(f"{path / name}: missing from the checkpoint's manifests")
    if keys is None:
        selected = sorted(files)
    else:
        selected = sorted({c["file"] for fqn, t in idx["tensors"].items() if fqn.split(".", 1)[0] in keys for c in t["chunks"]} | set(need) & set(files))
    rank, world = share
    floats: dict[str, list] = {}  # file -> its floating chunks, checked finite in the checksum's read
    for fqn, t in idx["tensors"].items():
        dtype = dtype_from_code(t["dtype"])
        if dtype.is_floating_point:
            for c in t["chunks"]:
                floats.setdefault(c["file"], []).append((c["start"], c["length"], dtype, fqn))
    for i, name in enumerate(selected):
        p = path / name
        try:
            p = member(path, name)
            size = p.lstat().st_size
            if size != files[name]["bytes"]:
                raise CorruptFile(p, f"{size} bytes, the checkpoint recorded {files[name]['bytes']} (truncated or replaced)")
            if i % world == rank:
                scan_file(p, files[name]["bytes"], files[name][HASH_NAME], floats.get(name, []))
        except CorruptFile as e:
            problems.append(str(e))
        except OSError as e:
            problems.append(f"{p}: {e.strerror or e}")
    return idx, problems


def read_member(path: Path, name: str, info: dict) -> bytes:
    """A small file's bytes, its checksum verified on these very bytes."""
    from .integrity import digest

    f = member(path, name)
    if info["bytes"] > MAX_JSON_BYTES:
        raise CorruptFile(f, "too large for a state file")
    with open_member(f) as fh:
        data = fh.read(info["bytes"] + 1)
    if len(data) != info["bytes"] or digest(data) != info[HASH_NAME]:
        raise CorruptFile(f, "checksum mismatch: the file changed after it was written")
    return data


# ------------------------------------------------------------------------------------- reading
def _read_chunk(fh, c: dict, dtype: torch.dtype, file: Path, out: torch.Tensor | None = None) -> torch.Tensor:
    t = out if out is not None else torch.empty(c["sizes"], dtype=dtype)
    if t.numel():
        fh.seek(c["start"])
        _read_exact(fh, byte_view(t), file)
    return t


def to_metadata(idx: dict) -> Metadata:
    """DCP's in-memory index, built field by field from the JSON one."""
    sdm = {}
    for fqn, t in idx["tensors"].items():
        sdm[fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=dtype_from_code(t["dtype"])),
            size=torch.Size(t["shape"]),
            chunks=[ChunkStorageMetadata(offsets=torch.Size(c["offsets"]), sizes=torch.Size(c["sizes"])) for c in t["chunks"]],
        )
    paths = {fqn: tuple(p) for fqn, p in idx.get("paths", {}).items()}
    return Metadata(state_dict_metadata=sdm, planner_data=paths or None)


class SafetensorsReader(StorageReader):
    """Reads the chunks each rank's plan asks for; ``idx`` is an index :func:`verify` accepted."""

    def __init__(self, path: str | Path, idx: dict):
        super().__init__()
        self.path, self.idx = Path(path), idx
        self.chunks = {(fqn, tuple(c["offsets"])): (c, dtype_from_code(t["dtype"])) for fqn, t in idx["tensors"].items() for c in t["chunks"]}

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return to_metadata(self.idx)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        per_file: dict[str, list] = {}
        for req in plan.items:
            if req.type != LoadItemType.TENSOR:
                raise CheckpointError(f"{self.path}: {req.storage_index.fqn!r} is not a tensor (a checkpoint holds tensors only)")
            c, dtype = self.chunks[(req.storage_index.fqn, tuple(req.storage_index.offset or ()))]
            per_file.setdefault(c["file"], []).append((c["start"], req, c, dtype))
        for name, reqs in per_file.items():
            file = member(self.path, name)
            reqs.sort(key=lambda r: r[0])
            cached: tuple[int, torch.Tensor] | None = None
            with open_member(file) as fh:
                for start, req, c, dtype in reqs:
                    if cached is None or cached[0] != start:
                        cached = (start, _read_chunk(fh, c, dtype, file))
                    t = cached[1]
                    for dim, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                        t = t.narrow(dim, o, n)
                    target = planner.resolve_tensor(req).detach()
                    if target.size() != t.size():
                        raise CheckpointError(f"{file}: chunk of {req.storage_index.fqn!r} is {tuple(t.size())}, expected {tuple(target.size())}")
                    target.copy_(t)
                    planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True


def read_full(path: Path, idx: dict, fqns: list[str]) -> dict[str, torch.Tensor]:
    """Whole tensors, assembled from their chunks, on one process (no process group needed)."""
    out = {fqn: torch.empty(idx["tensors"][fqn]["shape"], dtype=dtype_from_code(idx["tensors"][fqn]["dtype"])) for fqn in fqns}
    per_file: dict[str, list] = {}
    for fqn in fqns:
        for c in idx["tensors"][fqn]["chunks"]:
            per_file.setdefault(c["file"], []).append((c["start"], fqn, c))
    filled = dict.fromkeys(fqns, 0)
    for name, items in per_file.items():
        file = member(path, name)
        items.sort(key=lambda x: x[0])
        with open_member(file) as fh:
            for _, fqn, c in items:
                filled[fqn] += math.prod(c["sizes"])
                dst = out[fqn]
                if list(dst.shape) == c["sizes"]:  # the whole tensor in one chunk: read in place
                    _read_chunk(fh, c, dst.dtype, file, out=dst)
                    continue
                view = dst
                for dim, (o, n) in enumerate(zip(c["offsets"], c["sizes"])):
                    view = view.narrow(dim, o, n)
                view.copy_(_read_chunk(fh, c, dst.dtype, file))
    for fqn, n in filled.items():  # read_index proved the chunks disjoint: every element was read once
        if n != out[fqn].numel():
            raise CorruptFile(path / INDEX, f"tensor {fqn[:80]!r}: its chunks fill {n} of {out[fqn].numel()} elements")
    return out


__all__ = ["INDEX", "SafetensorsReader", "SafetensorsWriter", "read_full", "read_index", "read_member", "to_metadata", "verify"]
