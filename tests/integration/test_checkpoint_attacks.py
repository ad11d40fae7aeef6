"""Hostile checkpoints through every command that loads one: resume (`vitscale train` on the run
folder), `checkpoint.init_from`, `vitscale eval`, `vitscale convert`, `vitscale label-tokens`. Each
payload, if it ran, would create a canary file; each is first shown to be live (the reader it
targets runs it), then every command refuses the checkpoint with one line and the canary never
appears."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from vitscale.cli import main

TINY = ["model.num_layers=1", "train.batch_size=32", "data.num_workers=0", "log.flops=false", "eval.every=0", "log.progress=none",
        "log.report=false", "log.tensorboard=false"]  # fmt: skip
STEP = "step_00000002"


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Path:
    """A real run folder: one checkpoint (step 2) and model.safetensors."""
    run = tmp_path_factory.mktemp("genuine") / "run"
    assert main(["train", "digits_vit", "train.max_steps=2", "checkpoint.every=2", f"train.output_dir={run}", *TINY]) == 0
    return run


def _commands(run: Path, tmp: Path) -> dict[str, list[str]]:
    return {
        "resume": ["train", "digits_vit", "train.max_steps=3", "checkpoint.allow_changes=train.max_steps", f"train.output_dir={run}", *TINY],
        "init_from": ["train", "digits_vit", "train.max_steps=1", f"checkpoint.init_from={run}", f"train.output_dir={tmp / 'ft'}", *TINY],
        "eval": ["eval", "digits_vit", f"checkpoint.path={run}", "model.num_layers=1", "data.num_workers=0"],
        "convert": ["convert", str(run), str(tmp / "out.safetensors")],
        "label-tokens": ["label-tokens", "digits_vit", f"teacher.checkpoint={run}", "model.num_layers=1", str(tmp / "labels")],
    }


def _refused_everywhere(run: Path, tmp: Path, canary: Path, reason: str, capsys, commands=None) -> None:
    for name, argv in _commands(run, tmp).items():
        if commands and name not in commands:
            continue
        capsys.readouterr()
        try:
            rc = main(argv)
        except BaseException as e:  # noqa: B036 - a traceback is a failure too, after the canary check
            rc = e
        err = capsys.readouterr().err.strip().splitlines()
        assert not canary.exists(), f"{name}: the payload ran"
        assert isinstance(rc, int) and rc != 0, f"{name}: accepted a hostile checkpoint ({rc!r})"
        assert err and len(err) <= 2 and reason in err[-1], f"{name}: {err}"
    assert not (tmp / "out.safetensors").exists() and not (tmp / "labels").exists()


# ------------------------------------------------------------------------------------- payloads
def _code_args(code) -> tuple:
    names = ["co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals", "co_stacksize", "co_flags", "co_code",
             "co_consts", "co_names", "co_varnames", "co_filename", "co_name", "co_qualname", "co_firstlineno", "co_linetable",
             "co_exceptiontable", "co_freevars", "co_cellvars"]  # fmt: skip
    if sys.version_info < (3, 11):
        names = [n for n in names if n not in ("co_qualname", "co_exceptiontable")]
    return tuple(getattr(code, n) for n in names)


def _unicode(s: str) -> bytes:
    b = s.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(b)]) + b


def chain_pickle(canary: Path) -> bytes:
    """Protocol-4 pickle that names only *attributes of an allowed DCP metadata class*, which are
    types (so an allow-list of "classes of that module" passes them): ``Metadata.__init__.__class__``
    is FunctionType, ``….__code__.__class__`` CodeType; it builds a function and calls it."""
    code = compile(f"open({str(canary)!r}, 'w').write('ran')", "<checkpoint>", "exec")
    inner = pickle.dumps(_code_args(code), protocol=4)
    body = inner[2:-1]  # without PROTO and STOP
    if body[:1] == pickle.FRAME:
        body = body[9:]
    mod = _unicode("torch.distributed.checkpoint.metadata")
    return (
        b"\x80\x04"
        + mod + _unicode("Metadata.__init__.__class__") + pickle.STACK_GLOBAL
        + mod + _unicode("Metadata.__init__.__code__.__class__") + pickle.STACK_GLOBAL
        + body + pickle.REDUCE  # CodeType(*args)
        + pickle.EMPTY_DICT + pickle.TUPLE2 + pickle.REDUCE  # FunctionType(code, {})
        + pickle.EMPTY_TUPLE + pickle.REDUCE + pickle.STOP  # called
    )  # fmt: skip


class _Payload:
    def __init__(self, canary: Path):
        self.canary = str(canary)

    def __reduce__(self):
        return (exec, (f"open({self.canary!r}, 'w').write('ran')",))


def _legacy(run: Path) -> Path:
    """The run's checkpoint in the old layout (DCP's stock writer: pickled ``.metadata``,
    ``__0_0.distcp``), holding the same state: model, optimizer, EMA."""
    import torch.distributed.checkpoint as dcp

    step = run / "checkpoints" / STEP
    if (step / ".metadata").is_file():  # written by a vitscale of that format already
        return step
    from vitscale.checkpoint.storage import read_full, read_index

    idx = read_index(step)
    flat = read_full(step, idx, list(idx["tensors"]))
    nested: dict = {}
    for fqn, t in flat.items():  # back to the trainer's nesting: {"model": {...}, "optim": {"state": {...}}}
        *parents, leaf = idx["paths"][fqn]
        node = nested
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = t
    state = (step / "trainer_state.json").read_text()
    shutil.rmtree(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP: "assuming the intent is to save in a single process"
        dcp.save(nested, checkpoint_id=str(step))
    (step / "trainer_state.json").write_text(state)
    return step


def _copy(genuine: Path, tmp: Path) -> Path:
    run = tmp / "run"
    shutil.copytree(genuine, run)
    (run / "model.safetensors").unlink()  # the commands must read the checkpoint
    return run


def _stock_dcp_load(step: Path, keys) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            dcp.load({"model": {k: torch.empty(0) for k in keys}}, checkpoint_id=str(step))
        except BaseException:  # noqa: B036 - what it raises after running the payload does not matter
            pass


# ------------------------------------------------------------------------------------- old format
def test_old_format_pickle_reaching_code_through_allowed_class(genuine, tmp_path, capsys):
    canary = tmp_path / "canary"
    payload = chain_pickle(canary)
    pickle.loads(payload)  # the payload is live: an unpickler that resolves these names runs it
    assert canary.exists()
    canary.unlink()
    run = _copy(genuine, tmp_path)
    step = _legacy(run)
    (step / ".metadata").write_bytes(payload)
    _refused_everywhere(run, tmp_path, canary, "old checkpoint format", capsys)
    # and through a fresh process, as a user runs it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "vitscale", *_commands(run, tmp_path)["resume"]], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 1 and not canary.exists(), res.stderr[-2000:]
    assert len(res.stderr.strip().splitlines()) == 1 and "checkpoint.init_from=model.safetensors" in res.stderr


def test_old_format_bytes_item_loaded_with_torch_load(genuine, tmp_path, capsys):
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    canary = tmp_path / "canary"
    run = _copy(genuine, tmp_path)
    step = _legacy(run)
    # metadata made only of DCP's own classes declares model.pos_embed as a bytes item, which DCP
    # hands to torch.load(weights_only=False); the bytes are a pickle that runs code
    md = pickle.loads((step / ".metadata").read_bytes())  # our own file, written just above
    data = step / "__0_0.distcp"
    blob = pickle.dumps(_Payload(canary))
    offset = data.stat().st_size
    with open(data, "ab") as f:
        f.write(blob)
    md.state_dict_metadata["model.pos_embed"] = BytesStorageMetadata()
    info = md.storage_data[next(i for i in md.storage_data if i.fqn == "model.pos_embed")]
    md.storage_data = {i: v for i, v in md.storage_data.items() if i.fqn != "model.pos_embed"}
    md.storage_data[MetadataIndex("model.pos_embed")] = type(info)(relative_path=info.relative_path, offset=offset, length=len(blob))
    (step / ".metadata").write_bytes(pickle.dumps(md))
    _stock_dcp_load(step, ["pos_embed"])  # the payload is live: DCP's stock reader runs it
    assert canary.exists()
    canary.unlink()
    _refused_everywhere(run, tmp_path, canary, "old checkpoint format", capsys)


# ------------------------------------------------------------------------------------- new format
def _reseal(step: Path) -> None:
    """What an attacker who rewrites files also does: recompute every checksum, so that only the
    format's own rules stand in the way."""
    from vitscale.checkpoint.integrity import digest, seal_json

    idx = json.loads((step / "checkpoint.json").read_text())
    for name in idx["manifests"]:
        man = json.loads((step / name).read_text())
        for f, info in man["files"].items():
            p = step / f
            if p.exists():
                data = p.read_bytes()
                info.update({"bytes": len(data), "xxh3_64": digest(data)})
        (step / name).write_bytes(seal_json(man))
    (step / "checkpoint.json").write_bytes(seal_json(idx))


def _edit_index(step: Path, fn) -> None:
    idx = json.loads((step / "checkpoint.json").read_text())
    fn(idx)
    (step / "checkpoint.json").write_text(json.dumps(idx))
    _reseal(step)


def test_index_naming_a_file_outside_the_folder(genuine, tmp_path, capsys):
    run = _copy(genuine, tmp_path)
    step = run / "checkpoints" / STEP
    shutil.copy(step / "model-rank00000.safetensors", tmp_path / "outside.safetensors")

    def escape(idx):
        for t in idx["tensors"].values():
            for c in t["chunks"]:
                if c["file"] == "model-rank00000.safetensors":
                    c["file"] = "../../../outside.safetensors"

    _edit_index(step, escape)
    man = json.loads((step / "files-rank00000.json").read_text())  # listed, with its true checksum
    man["files"]["../../../outside.safetensors"] = man["files"].pop("model-rank00000.safetensors")
    (step / "files-rank00000.json").write_text(json.dumps(man))
    _reseal(step)
    _refused_everywhere(run, tmp_path, tmp_path / "canary", "not a plain file name inside the checkpoint folder", capsys)


def test_symlinked_file_in_checkpoint(genuine, tmp_path, capsys):
    run = _copy(genuine, tmp_path)
    step = run / "checkpoints" / STEP
    target = tmp_path / "elsewhere.safetensors"
    shutil.move(step / "model-rank00000.safetensors", target)
    (step / "model-rank00000.safetensors").symlink_to(target)  # same bytes: every checksum matches
    _reseal(step)
    _refused_everywhere(run, tmp_path, tmp_path / "canary", "is a symbolic link", capsys)


def test_huge_declared_sizes_allocate_nothing(genuine, tmp_path, capsys):
    run = _copy(genuine, tmp_path)
    step = run / "checkpoints" / STEP

    def huge(idx):
        t = idx["tensors"]["model.pos_embed"]
        t["shape"] = [1, 2**40, 96]
        t["chunks"] = [{**t["chunks"][0], "offsets": [0, 0, 0], "sizes": [1, 2**40, 96], "length": 4 * 96 * 2**40}]

    _edit_index(step, huge)
    _refused_everywhere(run, tmp_path, tmp_path / "canary", "a chunk reaches past the end of the file", capsys)


def test_pickle_bytes_as_tensor_data_stay_numbers(genuine, tmp_path, capsys):
    """Bytes in a tensor's place are copied into the tensor, never deserialized: a pickle there is
    just a few odd weights (the checksums were recomputed, so it loads)."""
    from vitscale.checkpoint import read_weights

    canary = tmp_path / "canary"
    run = _copy(genuine, tmp_path)
    step = run / "checkpoints" / STEP
    idx = json.loads((step / "checkpoint.json").read_text())
    c = idx["tensors"]["model.pos_embed"]["chunks"][0]
    blob = pickle.dumps(_Payload(canary))
    assert len(blob) <= c["length"]
    shard = bytearray((step / c["file"]).read_bytes())
    shard[c["start"] : c["start"] + len(blob)] = blob
    (step / c["file"]).write_bytes(bytes(shard))
    _reseal(step)
    w = read_weights(run)
    assert w["pos_embed"].numel() * 4 == c["length"] and not canary.exists()
    assert main(_commands(run, tmp_path)["eval"]) == 0 and not canary.exists()


def test_crafted_export_refused_by_every_weights_reader(genuine, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    header = json.dumps({"pos_embed": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 2**42]}}).encode()
    (run / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 64)
    _refused_everywhere(run, tmp_path, tmp_path / "canary", "the tensors take 4398046511104 bytes, the file holds 64",
                        capsys, commands=("init_from", "eval", "label-tokens"))  # fmt: skip


# ------------------------------------------------------------------------------------- round two
# A second round of attacks (docs/trust.md): the index as geometry, non-finite state, crafted shapes,
# links to another run's checkpoints. Where a run has an older intact checkpoint, every loader falls
# back to it with a warning, as for any damage.
@pytest.fixture(scope="module")
def two_steps(tmp_path_factory) -> Path:
    """A real run folder with two checkpoints (steps 1 and 2) and no export."""
    run = tmp_path_factory.mktemp("two") / "run"
    assert main(["train", "digits_vit", "train.max_steps=2", "checkpoint.every=1", "checkpoint.keep=2", "checkpoint.export_safetensors=false",
                 f"train.output_dir={run}", *TINY]) == 0  # fmt: skip
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000001", STEP]
    return run


def _copy2(two_steps: Path, tmp: Path) -> Path:
    run = tmp / "run"
    shutil.copytree(two_steps, run)
    return run


def _falls_back(run: Path, tmp: Path, reason: str, capsys, caplog, commands=("convert", "eval", "resume")) -> None:
    """``commands`` on ``run`` skip its damaged step 2 with a warning naming ``reason`` and use step 1
    (the converted file holds its weights; the resume starts from it)."""
    from vitscale.checkpoint import read_weights

    older = read_weights(run / "checkpoints" / "step_00000001")
    for name in commands:
        caplog.clear()
        capsys.readouterr()
        assert main(_commands(run, tmp)[name]) == 0, name
        lines = capsys.readouterr().err.splitlines() + [r.getMessage() for r in caplog.records]
        warned = [line for line in lines if "skipping damaged checkpoint step_00000002" in line]
        assert warned and reason in warned[0], f"{name}: {lines}"
        if name == "convert":
            out = read_weights(tmp / "out.safetensors")
            assert out.keys() == older.keys() and all(torch.equal(out[k], older[k]) for k in out)
    assert "resumed from" in (run / "train.log").read_text() and "step_00000001 at step 1" in (run / "train.log").read_text()
    assert (run / "checkpoints" / "step_00000003").is_dir()


def _rechunk_rows(idx: dict, fqn: str) -> list[dict]:
    """``fqn``'s one chunk cut into one chunk per row, pointing at the same bytes: an exact tiling."""
    t = idx["tensors"][fqn]
    (c,) = t["chunks"]
    rows, row_bytes = t["shape"][0], c["length"] // t["shape"][0]
    return [{**c, "offsets": [i] + [0] * (len(t["shape"]) - 1), "sizes": [1] + t["shape"][1:], "start": c["start"] + i * row_bytes,
             "length": row_bytes} for i in range(rows)]  # fmt: skip


QKV = "model.blocks.0.attn.qkv_per_head.weight"  # (288, 96)


def test_index_tiling_exactly_loads_the_same_weights(genuine, tmp_path):
    """The control: the same tensor indexed as 288 row chunks (a tiling) reads back identically."""
    from vitscale.checkpoint import read_weights

    run = _copy(genuine, tmp_path)
    step = run / "checkpoints" / STEP
    before = read_weights(run)
    _edit_index(step, lambda idx: idx["tensors"][QKV].update(chunks=_rechunk_rows(idx, QKV)))
    after = read_weights(run)
    assert all(torch.equal(after[k], before[k]) for k in before)


def _one_row_many_times(idx: dict) -> None:
    rows = _rechunk_rows(idx, QKV)
    idx["tensors"][QKV]["chunks"] = [rows[0]] * len(rows)  # element counts add up; rows 1..287 in no chunk


def test_index_listing_one_chunk_many_times(genuine, tmp_path, capsys):
    """The attack of issue 24: read_full allocated the tensor with torch.empty and filled row 0 only,
    so convert exported heap memory and init_from trained on it."""
    run = _copy(genuine, tmp_path)
    step = run / "checkpoints" / STEP
    _edit_index(step, _one_row_many_times)
    t = json.loads((step / "checkpoint.json").read_text())["tensors"][QKV]
    assert sum(c["sizes"][0] * c["sizes"][1] for c in t["chunks"]) == t["shape"][0] * t["shape"][1]  # what the old check summed
    _refused_everywhere(run, tmp_path, tmp_path / "canary", f"tensor {QKV!r}: two of its chunks overlap", capsys)


def test_overlapping_chunks_fall_back_to_the_older_checkpoint(two_steps, tmp_path, capsys, caplog):
    run = _copy2(two_steps, tmp_path)
    _edit_index(run / "checkpoints" / STEP, _one_row_many_times)
    _falls_back(run, tmp_path, "two of its chunks overlap", capsys, caplog)


def _nan_into(step: Path, fqn: str) -> None:
    """A NaN written over the first element of ``fqn``'s bytes, every checksum recomputed."""
    c = json.loads((step / "checkpoint.json").read_text())["tensors"][fqn]["chunks"][0]
    data = bytearray((step / c["file"]).read_bytes())
    data[c["start"] : c["start"] + 4] = struct.pack("<f", float("nan"))
    (step / c["file"]).write_bytes(bytes(data))
    _reseal(step)


def test_nan_in_optimizer_state_falls_back_to_the_older_checkpoint(two_steps, tmp_path, capsys, caplog):
    """Was loaded unchecked: the first step after the resume made the weights NaN, and every resume repeated it."""
    run = _copy2(two_steps, tmp_path)
    fqn = "optim.state.blocks.0.attn.qkv_per_head.weight.exp_avg"
    _nan_into(run / "checkpoints" / STEP, fqn)
    # convert and eval read the model's files only, which are intact: they use step 2
    _falls_back(run, tmp_path, f"non-finite values (NaN or infinity) in {fqn}", capsys, caplog, commands=("resume",))
    from vitscale.checkpoint.storage import verify

    newest = run / "checkpoints" / "step_00000003"  # trained from step 1: finite, and the next resume starts there
    assert verify(newest)[1] == [] and sorted(p.name for p in (run / "checkpoints").iterdir()) == [newest.name]


def test_nan_in_weights_refused_by_every_command(genuine, tmp_path, capsys):
    run = _copy(genuine, tmp_path)
    _nan_into(run / "checkpoints" / STEP, "model.head.weight")
    _refused_everywhere(run, tmp_path, tmp_path / "canary", "non-finite values (NaN or infinity) in model.head.weight", capsys)


@pytest.mark.parametrize(
    "fqn, shape, reason",
    [
        ("model.head.bias", [0, 2**61, 2**61], "overflows (more than 2^63 bytes)"),  # zero elements, 2^122 of stride
        ("model.cls_token", [1] * 99 + [96], "100 dimensions, more than 32"),
    ],
)
def test_crafted_shapes_are_one_line(genuine, tmp_path, capsys, fqn, shape, reason):
    """Were RuntimeError tracebacks from eval, init_from and convert."""
    run = _copy(genuine, tmp_path)

    def craft(idx):
        t = idx["tensors"][fqn]
        t["shape"] = shape
        t["chunks"] = [{**t["chunks"][0], "offsets": [0] * len(shape), "sizes": shape, "length": nbytes_of(shape)}]

    _edit_index(run / "checkpoints" / STEP, craft)
    _refused_everywhere(run, tmp_path, tmp_path / "canary", reason, capsys)
    # the same shapes in an exported weights file (read by init_from, eval, label-tokens)
    export = tmp_path / "export"
    export.mkdir()
    header = json.dumps({fqn.split(".", 1)[1]: {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes_of(shape)]}}).encode()
    (export / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * nbytes_of(shape))
    _refused_everywhere(export, tmp_path, tmp_path / "canary", reason, capsys, commands=("init_from", "eval", "label-tokens"))


def nbytes_of(shape: list[int]) -> int:
    n = 4
    for d in shape:
        n *= d
    return n


def _other_run(genuine: Path, tmp: Path) -> Path:
    """Another run's intact checkpoint: genuine's, its head.bias rewritten (checksums recomputed)."""
    other = tmp / "other"
    shutil.copytree(genuine, other)
    step = other / "checkpoints" / STEP
    c = json.loads((step / "checkpoint.json").read_text())["tensors"]["model.head.bias"]["chunks"][0]
    data = bytearray((step / c["file"]).read_bytes())
    data[c["start"] : c["start"] + c["length"]] = struct.pack("<f", 7.0) * (c["length"] // 4)
    (step / c["file"]).write_bytes(bytes(data))
    _reseal(step)
    return other


def test_a_step_folder_linked_to_another_run_is_not_used(genuine, two_steps, tmp_path, capsys, caplog):
    """``checkpoints/step_00000003`` a symbolic link to another run's (intact, newer) checkpoint: was
    used by convert and eval. Now skipped as not the run's own; a resume trains step 3 itself and
    replaces the link, leaving the other run's folder as it was."""
    from vitscale.checkpoint import read_weights
    from vitscale.checkpoint.storage import verify

    other = _other_run(genuine, tmp_path)
    run = _copy2(two_steps, tmp_path)
    link = run / "checkpoints" / "step_00000003"
    link.symlink_to(other / "checkpoints" / STEP)
    own = read_weights(run / "checkpoints" / STEP)
    capsys.readouterr()
    assert main(_commands(run, tmp_path)["convert"]) == 0
    lines = capsys.readouterr().err.splitlines() + [r.getMessage() for r in caplog.records]
    assert any("skipping damaged checkpoint step_00000003" in line and "is a symbolic link" in line for line in lines), lines
    out = read_weights(tmp_path / "out.safetensors")
    assert torch.equal(out["head.bias"], own["head.bias"]) and not torch.all(out["head.bias"] == 7.0)
    assert main(_commands(run, tmp_path)["eval"]) == 0
    assert main(["train", "digits_vit", "train.max_steps=3", "checkpoint.allow_changes=train.max_steps", "checkpoint.every=1", "checkpoint.keep=2",
                 "checkpoint.export_safetensors=false", f"train.output_dir={run}", *TINY]) == 0  # fmt: skip
    assert "step_00000002 at step 2" in (run / "train.log").read_text()
    assert not link.is_symlink() and link.is_dir() and verify(link)[1] == []
    assert verify(other / "checkpoints" / STEP)[1] == [] and torch.all(read_weights(other / "checkpoints" / STEP)["head.bias"] == 7.0)


def test_a_linked_checkpoints_folder_is_refused(genuine, tmp_path, capsys):
    other = _other_run(genuine, tmp_path)
    run = _copy(genuine, tmp_path)
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(other / "checkpoints")
    _refused_everywhere(run, tmp_path, tmp_path / "canary", "is a symbolic link", capsys, commands=("resume", "eval", "convert", "init_from"))
