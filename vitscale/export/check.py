"""The check of a written export: the file, loaded back (ONNX Runtime on the CPU, or the
``torch.export`` program), against the trained model in eager mode on real inputs.

Images: the first validation digits (scikit-learn's handwritten digits) and scikit-learn's two sample
photos (``load_sample_images``: a temple in China, a flower), through vitscale's evaluation
transform and normalisation. Captions (CLIP): the run's caption templates filled with its class
names, and captions of the two photos. The error of an output is ``max |exported - eager| /
max |eager|`` over the batch; it passes at or below ``TOLERANCE``.
"""

from __future__ import annotations

import numpy as np
import torch

TOLERANCE = 1e-4
PHOTO_CAPTIONS = ("a photo of a chinese temple.", "a close-up photo of a red flower.")
INPUTS_TEXT = {  # per input kind
    "image": "3 validation digits + scikit-learn's 2 sample photos (china.jpg, flower.jpg), vitscale's eval transform",
    "tokens": "captions: the run's caption templates filled with class names + 2 captions of the sample photos",
}


def real_images(source, n_digits: int = 3) -> torch.Tensor:
    """``(n_digits + 2, C, H, W)`` normalised float32: digits then the two sample photos."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    from vitscale.data.decode import convert_mode, pil_to_uint8_tensor
    from vitscale.data.digits import load_digits_split
    from vitscale.data.transforms import SampleTransform

    from .spec import preprocess_spec

    pre = preprocess_spec(source)
    c = pre["channels"]
    tf = SampleTransform(source.cfg.data, tuple(pre["image_size"]), c, source.cfg.train.seed, train=False)
    digits = load_digits_split("val", c)[0][:n_digits]  # (n, C, 8, 8) uint8
    photos = [pil_to_uint8_tensor(convert_mode(Image.fromarray(a), c)) for a in load_sample_images().images]
    crops = torch.stack([tf.tensor_eval(img.contiguous()).image for img in [*digits, *photos]])  # (N, C, H, W) uint8
    mean = torch.tensor(pre["mean"]).view(1, c, 1, 1)
    std = torch.tensor(pre["std"]).view(1, c, 1, 1)
    return (crops.float() / 255.0 - mean) / std


def real_captions(source, tokenizer, n: int = 3) -> torch.Tensor:
    """``(n + 2, context_length)`` token ids of real captions, by the model family's ``tokenizer``."""
    from .spec import run_class_names

    names = run_class_names(source) or ["seven", "two", "nine"]
    templates = list(source.cfg.clip.caption_templates)
    texts = [templates[i % len(templates)].format(names[(3 * i + 7) % len(names)]) for i in range(n)]
    return tokenizer([*texts, *PHOTO_CAPTIONS])


def batches(x: torch.Tensor, batch: int | None) -> list[torch.Tensor]:
    """The check's batches: sizes 1 and all (5) for a dynamic batch, else ``batch``-sized tiles."""
    if batch is None:
        return [x[:1], x]
    n = -(-x.shape[0] // batch) * batch  # every input, in whole batches (the last one tiled)
    tiled = x.repeat(-(-n // x.shape[0]), *([1] * (x.dim() - 1)))[:n]
    return list(tiled.split(batch))


def rel_error(out, ref) -> float:
    out, ref = torch.as_tensor(np.asarray(out)), torch.as_tensor(np.asarray(ref))
    return float((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30))


def onnx_runner(path):
    """``fn(x) -> output`` of ONNX Runtime on the CPU."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        from .graphs import MissingDependency

        raise MissingDependency(e.name) from None
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda x: sess.run(None, {name: x.numpy()})[0], f"onnxruntime {ort.__version__} (CPUExecutionProvider)"


def pt2_runner(path):
    """``fn(x) -> output`` of the loaded ``torch.export`` program (see ``vitscale.export.pt2``)."""
    from .pt2 import load_program

    module = load_program(path).module()
    return (lambda x: module(x).detach()), f"torch.export.load, torch {torch.__version__}"


def check_graph(graph, path, fmt: str, batch: int | None) -> dict:
    """Run the written file and the eager model on the graph's real inputs; the report for export.json."""
    from .graphs import MissingDependency
    from .pt2 import UnsafeArchiveError

    report = {"runtime": "onnxruntime" if fmt == "onnx" else "torch.export.load", "inputs": INPUTS_TEXT[graph.input_name]}
    errors: dict[str, float] = {}
    try:
        run, report["runtime"] = (onnx_runner if fmt == "onnx" else pt2_runner)(path)
        with torch.no_grad():
            for x in batches(graph.example, batch):
                errors[str(x.shape[0])] = max(errors.get(str(x.shape[0]), 0.0), rel_error(run(x), graph.reference(x)))
    except (MissingDependency, UnsafeArchiveError):
        raise
    except Exception as e:  # noqa: BLE001 - the written file does not load or run: the check fails
        report["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    worst = max(errors.values()) if errors and "error" not in report else float("inf")
    return report | {
        "max_rel_error_by_batch": errors,
        "max_rel_error": worst,
        "tolerance": TOLERANCE,
        "passed": bool(worst <= TOLERANCE),
    }
