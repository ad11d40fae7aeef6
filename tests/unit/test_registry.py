"""The one registry (``vitscale.registry``): each kind of named object — model, task, data format,
evaluator, command — is looked up the same way, built-in names import their module on first use, and
an unknown name is one line naming its key and the closest name; ``vitscale --import`` loads a plug-in."""

from __future__ import annotations

import pytest

from vitscale.cli import main
from vitscale.data.formats import FORMATS
from vitscale.errors import ConfigError
from vitscale.eval.evaluator import EVALUATORS
from vitscale.models.registry import get_family
from vitscale.registry import COMMANDS, Registry
from vitscale.tasks.base import TASKS


@pytest.mark.parametrize(
    "lookup, given, expected",
    [
        (get_family, "vit_b61", "model.name: unknown model 'vit_b61'; did you mean 'vit_b16'? (`vitscale models` lists them;"),
        (TASKS.get, "contrastve", "train.task: unknown task 'contrastve'; did you mean 'contrastive'? (choose one of "
         "classification, contrastive, dino, feature_distill, mae, token_labeling;"),
        (FORMATS.get, "imagefoldr", "data.format: unknown data format 'imagefoldr'; did you mean 'imagefolder'? (choose one of "
         "csv, digits, digits_aspect, imagefolder, images, parquet, synthetic, webdataset;"),
        (EVALUATORS.get, "zeroshoot", "kind: unknown evaluator 'zeroshoot'; did you mean 'zeroshot'? (choose one of "),
        (COMMANDS.get, "trian", "vitscale: unknown command 'trian'; did you mean 'train'? (choose one of "),
    ],
)  # fmt: skip
def test_an_unknown_name_is_one_line_with_the_closest_name(lookup, given, expected):
    with pytest.raises(ConfigError) as e:
        lookup(given)
    text = str(e.value)
    assert text.startswith(expected) and text.endswith("a plug-in's: load it with vitscale --import MODULE)")
    assert "\n" not in text


def test_a_built_in_name_imports_its_module_on_first_use(tmp_path, monkeypatch):
    (tmp_path / "reg_plugin_mod.py").write_text("from test_registry_target import R\n\n@R.register('b')\nclass B:\n    pass\n")
    (tmp_path / "test_registry_target.py").write_text("from vitscale.registry import Registry\n\nR = Registry('thing', 'x.thing', {'b': 'reg_plugin_mod'})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from test_registry_target import R  # noqa: I001

    assert isinstance(R, Registry) and R.entries == {} and R.names() == ["b"]
    assert R.get("b").__name__ == "B" and R.register("c", 3) == 3  # the decorator and the call register alike
    assert R.items() == [("b", R.get("b")), ("c", 3)] and "c" in R and "d" not in R


def test_a_plugin_that_fails_to_import_is_one_line_and_exit_code_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "broken_plugin.py").write_text("import no_such_package_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["--import", "broken_plugin", "train", "digits_vit"]) == 2
    err = capsys.readouterr().err
    assert err == "vitscale: --import broken_plugin: ModuleNotFoundError: No module named 'no_such_package_here'\n"
    assert main(["--import=not_a_module_anywhere", "models"]) == 2
    assert "--import not_a_module_anywhere: ModuleNotFoundError" in capsys.readouterr().err
