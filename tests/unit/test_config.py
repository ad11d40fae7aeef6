"""Typed config: defaults <- YAML <- dotted overrides, closest-key errors, type errors, round trip."""

import ast
import dataclasses
import inspect
import textwrap

import pytest

from vitscale.config import Config, ConfigError, config_to_dict, load_config, save_config, schema


def test_defaults_yaml_and_overrides_merge(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  lr: 0.5\n  betas: [0.8, 0.9]\ntrain:\n  max_steps: 7\n")
    cfg = load_config(path, ["optim.lr=3e-3", "train.seed=5", "data.mean=[0.1, 0.2, 0.3]"])
    assert cfg.optim.lr == pytest.approx(3e-3)  # override beats YAML
    assert cfg.optim.betas == (0.8, 0.9)  # YAML beats defaults, lists become tuples
    assert cfg.train.max_steps == 7 and cfg.train.seed == 5
    assert cfg.data.mean == (0.1, 0.2, 0.3)
    assert cfg.optim.weight_decay == Config().optim.weight_decay  # untouched default


def test_model_shorthand_routes_into_overrides():
    cfg = load_config(None, ["model.name=vit_debug", "model.hidden_size=128", "model.overrides.num_layers=3"])
    assert cfg.model.overrides == {"hidden_size": 128, "num_layers": 3}


@pytest.mark.parametrize(
    "override, suggestion",
    [
        ("optim.lrr=1", "optim.lr"),
        ("train.max_step=3", "train.max_steps"),
        ("train.lr=1", "optim.lr"),  # a key of another group
        ("trian.seed=1", "train"),
        ("model.hiden_size=3", "model.hidden_size"),
        ("schedule.warmup_step=3", "schedule.warmup_steps"),
    ],
)
def test_unknown_key_names_the_closest(override, suggestion):
    with pytest.raises(ConfigError, match="unknown config key") as e:
        load_config(None, [override])
    assert f"did you mean '{suggestion}'" in str(e.value)


@pytest.mark.parametrize(
    "override, field",
    [("train.max_steps=abc", "train.max_steps"), ("optim.lr=fast", "optim.lr"), ("train.compile=3", "train.compile"),
     ("optim.betas=[0.9]", "optim.betas"), ("model.hidden_size=1.5", "model")],
)  # fmt: skip
def test_wrong_type_names_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, [override])


def test_bad_choice_and_bad_model_name():
    with pytest.raises(ConfigError, match="optim.name.*adamw.*lamb"):
        load_config(None, ["optim.name=lars"])
    with pytest.raises(ConfigError, match="vit_b16"):
        load_config(None, ["model.name=vit_b17"])
    with pytest.raises(ConfigError, match="no config file or built-in config named 'digits_vt'.*digits_vit"):
        load_config("digits_vt")


def test_int_widens_to_float_and_yaml_exponent_string():
    cfg = load_config(None, ["optim.lr=1", "train.epochs=3"])
    assert isinstance(cfg.optim.lr, float) and cfg.optim.lr == 1.0
    assert isinstance(cfg.train.epochs, float)


def test_save_and_reload_round_trip(tmp_path):
    cfg = load_config("digits_vit", ["model.hidden_size=48", "optim.betas=[0.9, 0.95]"])
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg
    assert config_to_dict(again)["model"]["overrides"]["hidden_size"] == 48


@pytest.mark.parametrize("name", ["digits_vit", "imagenet_vit_b16", "imagenet_vit_b16_ft512", "imagenet21k_vit_b16_ft384",
                                  "imagenet_deit_b_distilled", "clip_b32_locked_image", "digits_mae",
                                  "digits_dino", "imagenet_dino_vitl14", "imagenet_unic_vitb16"])  # fmt: skip
def test_builtin_configs_load_and_open_with_a_comment(name):
    from vitscale.config import find_config

    cfg = load_config(name)
    assert cfg.model.name
    lines = find_config(name).read_text().splitlines()
    head = lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]  # the opening comment
    text = "\n".join(head).lower()
    assert head[0].startswith("#") and "launch" in text and "hardware" in text and "expected" in text


def test_recipe_values_follow_nemo():
    b16 = load_config("imagenet_vit_b16")
    assert (b16.train.epochs, b16.train.batch_size, b16.optim.lr, b16.optim.weight_decay) == (300, 4096, 3e-3, 0.3)
    assert b16.optim.betas == (0.9, 0.999) and b16.schedule.name == "cosine" and b16.data.img_size == 224
    assert b16.model.overrides["hidden_dropout"] == 0.1
    ft = load_config("imagenet_vit_b16_ft512")
    assert (ft.train.max_steps, ft.train.batch_size, ft.data.img_size, ft.optim.name) == (20000, 512, 512, "sgd")
    assert ft.optim.momentum == 0.9 and ft.optim.weight_decay == 0.0 and 0.003 <= ft.optim.lr <= 0.06


def test_finetuning_recipes_follow_their_sources():
    vit = load_config("imagenet21k_vit_b16_ft384")  # the ViT paper's ImageNet fine-tuning
    assert (vit.train.max_steps, vit.train.batch_size, vit.data.img_size, vit.optim.name, vit.optim.weight_decay) == (
        20000, 512, 384, "sgd", 0.0)  # fmt: skip
    assert vit.checkpoint.init_from == "hf-hub:timm/vit_base_patch16_224.orig_in21k" and vit.train.grad_clip == 1.0
    deit = load_config("imagenet_deit_b_distilled")  # DeiT's Table 9 and its distillation
    assert (deit.train.epochs, deit.train.batch_size, deit.optim.lr, deit.optim.lr_scale_batch) == (300, 1024, 5e-4, 512)
    assert deit.model.overrides["distill_token"] and (deit.distill.kind, deit.distill.alpha) == ("hard", 0.5)
    assert (deit.data.mixup_alpha, deit.data.cutmix_alpha, deit.data.random_erasing, deit.train.label_smoothing) == (0.8, 1.0, 0.25, 0.1)
    lit = load_config("clip_b32_locked_image")  # LiT / open_clip --lock-image
    assert lit.clip.lock_image and lit.checkpoint.init_from == "hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K"


def _dataclasses_in(module):
    return [c for c in vars(module).values() if inspect.isclass(c) and dataclasses.is_dataclass(c)
            and c.__module__ == module.__name__]  # fmt: skip


def test_every_field_has_a_docstring():
    import vitscale.config.data as data_config
    import vitscale.config.evals as evals_config

    for module in (schema, data_config, evals_config):
        for cls in _dataclasses_in(module):
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
            body = tree.body[0].body
            for i, node in enumerate(body):
                if isinstance(node, ast.AnnAssign):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    ok = isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
                    assert ok, f"{cls.__name__}.{node.target.id} has no docstring"


def test_choices_are_declared_once_in_the_schema():
    """The choices of a field are its ``Literal`` type: the loader, the bench and activation
    checkpointing all read them from there."""
    import typing

    from vitscale.distributed import activation_checkpoint
    from vitscale.distributed.config import ParallelConfig
    from vitscale.train.fastpath import SDPA_CHOICES

    hints = typing.get_type_hints(schema.TrainConfig)
    assert typing.get_args(hints["sdpa"]) == SDPA_CHOICES == ("auto", "flash", "cudnn", "efficient", "math", "default")
    ac = typing.get_type_hints(ParallelConfig)["activation_checkpointing"]
    assert typing.get_args(ac) == activation_checkpoint.MODES == ("none", "full", "selective")
    with pytest.raises(ConfigError, match="train.sdpa: 'fast' is not one of auto, flash, cudnn, efficient, math, default"):
        load_config(None, ["train.sdpa=fast"])
    with pytest.raises(ConfigError, match="parallel.activation_checkpointing: 'some' is not one of none, full, selective"):
        load_config(None, ["parallel.activation_checkpointing=some"])
    assert load_config(None, ["optim.name=sgd", "log.progress=none"]).log.progress == "none"


def test_dotted_shorthand_merges_into_a_nested_model_config():
    """``model.vision.num_layers=1`` changes one field of CLIP's vision tower and keeps the YAML's
    others (img_h, patch_dim, ...), exactly as ``model.overrides.vision.num_layers=1`` does."""
    yaml_vision = load_config("digits_clip").model.overrides["vision"]
    assert {"img_h", "patch_dim"} <= set(yaml_vision)
    for key in ("model.vision.num_layers=1", "model.overrides.vision.num_layers=1"):
        vision = load_config("digits_clip", [key]).model.overrides["vision"]
        assert vision == {**yaml_vision, "num_layers": 1}, key
