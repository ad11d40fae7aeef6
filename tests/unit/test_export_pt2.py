"""``vitscale.export.pt2``: a torch.export archive loads only when nothing in it needs an unrestricted
unpickler; tampered archives are refused before ``torch.export.load`` sees them, and nothing runs."""

import io
import json
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from vitscale.export.graphs import fold_batchnorm
from vitscale.export.pt2 import UnsafeArchiveError, check_archive, load_program


class _Touch:
    """Unpickling this creates ``path`` (what a hostile pickle would do, harmlessly)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()
    x = torch.randn(2, 3, 8, 8)
    path = tmp_path_factory.mktemp("pt2") / "model.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(path))
    return path, model, x


def _rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy the zip ``src`` to ``dst`` passing each (name, bytes) through ``edit`` (None drops it)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            got = edit(info.filename, zin.read(info.filename))
            if got is not None:
                zout.writestr(info.filename, got)
    return dst


def test_a_written_archive_loads_and_runs(archive):
    path, model, x = archive
    check_archive(path)
    assert torch.allclose(load_program(path).module()(x), model(x))


def test_archives_with_unrestricted_pickles_are_refused_and_nothing_runs(archive, tmp_path):
    path, _, _ = archive
    marker = tmp_path / "ran"
    evil = pickle.dumps(_Touch(marker))

    def sample_inputs(name, data):  # torch >= 2.8 archives; 2.6 / 2.7: serialized_example_inputs.pt
        return evil if "sample_inputs" in name or name.endswith("example_inputs.pt") else data

    def pickled_state_dict(name, data):  # torch 2.6 / 2.7 archives
        return evil if name.endswith("serialized_state_dict.pt") else data

    def pickled_weight(name, data):
        if name.endswith("_weights_config.json"):
            cfg = json.loads(data)
            first = next(iter(cfg["config"]))
            cfg["config"][first]["use_pickle"] = True
            return json.dumps(cfg).encode()
        return data

    def object_constant(name, data):
        if name.endswith("_constants_config.json"):
            return json.dumps({"config": {"obj": {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True}}}).encode()
        return data

    legacy = any(n.endswith("serialized_exported_program.json") for n in zipfile.ZipFile(path).namelist())
    edits = [(sample_inputs, "weights_only")]
    edits += [(pickled_state_dict, "weights_only")] if legacy else [(pickled_weight, "is pickled"), (object_constant, "object constant")]
    for edit, why in edits:
        bad = _rewrite(path, tmp_path / f"{edit.__name__}.pt2", edit)
        with pytest.raises(UnsafeArchiveError, match=why):
            load_program(bad)
    root = "" if legacy else zipfile.ZipFile(path).namelist()[0].split("/")[0] + "/"
    extra = tmp_path / "extra.pt2"
    with zipfile.ZipFile(extra, "w") as z:  # an AOTInductor library would be code: any unknown member is refused
        for info in zipfile.ZipFile(path).infolist():
            z.writestr(info.filename, zipfile.ZipFile(path).read(info.filename))
        z.writestr(f"{root}data/aotinductor/model/model.so", b"\x7fELF")
    with pytest.raises(UnsafeArchiveError, match="aotinductor"):
        load_program(extra)
    # torch 2.6 / 2.7 archives: the pickles at the top level are checked the same way
    legacy = tmp_path / "legacy.pt2"
    with zipfile.ZipFile(legacy, "w") as z:
        z.writestr("serialized_exported_program.json", b"{}")
        buf = io.BytesIO()
        torch.save({"w": torch.zeros(2)}, buf)
        z.writestr("serialized_constants.pt", buf.getvalue())  # plain tensors: fine
        z.writestr("serialized_state_dict.pt", evil)
        z.writestr("version", b"8.2")
    with pytest.raises(UnsafeArchiveError, match="serialized_state_dict.pt"):
        check_archive(legacy)
    with pytest.raises(UnsafeArchiveError, match="not a .pt2"):
        check_archive(tmp_path / "ran.pt2")
    assert not marker.exists()


def test_batchnorm_folding_keeps_the_outputs():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU())
    with torch.no_grad():
        bn = seq[1]
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.normal_()
        bn.bias.normal_()
    seq.eval()
    folded = fold_batchnorm(seq)
    assert isinstance(folded[1], nn.Identity) and isinstance(seq[1], nn.BatchNorm2d)  # a copy
    x = torch.randn(4, 3, 10, 10)
    assert torch.allclose(folded(x), seq(x), rtol=1e-5, atol=1e-5)
