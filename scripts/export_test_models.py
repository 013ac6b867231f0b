"""Export tiny, randomly initialised torchvision and transformers models to tests/exports/ for tests/test_exports.py.

Issue 15 asks for tests on what torch.onnx really writes (its Shape/Gather/Concat chains, Erf-based Gelu,
LayerNormalization, attention's reshapes and masks, dynamic dimensions named after torch.export.Dim), not only on
graphs built with onnx.helper. torch stays out of the test suite's install, so this script is run once, by hand,
with a Python that has torch, torchvision, transformers, onnx and onnxscript (see scripts/export_models.py for the
one-index rule on torch and torchvision), and the small .onnx files it writes are committed:

    python scripts/export_test_models.py                # every model into tests/exports/
    python scripts/export_test_models.py -o /tmp/x --models bert,gpt2

The committed files were made with torch 2.14.1, torchvision 0.29.1, transformers 5.24.0, onnx 1.23.2 and
onnxscript 0.7.2 (all from pypi), through the dynamo exporter at opset 18 (export_models.OPSET). Every model is
seeded with torch.manual_seed(0) and nothing is downloaded: torchvision builders get `weights=None`, transformers
models are built from a config. The CNNs' BatchNorms get random scales and shifts and the running statistics of
one random batch (calibrate_batch_norm): left at their initial (0, 1) statistics, the logits are ~1e-7 and agree
with anything at the tests' tolerance. Every model is written twice: `<name>_static.onnx` (the shapes below) and
`<name>_dynamic.onnx`, traced at batch 2 (sequence 8) with `batch` (and `seq`) as torch.export.Dim, which the
exporter writes as the dim_params `batch` and `seq` that farm's `--shape batch=N` pins. The example sizes of the
dynamic trace are at least 2 so that torch.export does not specialise them to 1.
With the versions above, a re-run writes byte-identical files.

Models (all float32 in, float32 out; token ids int64):
- mobilenet_v2: torchvision mobilenet_v2(width_mult=0.25, num_classes=10), `image` 1x3x64x64 -> `logits`
- mobilenet_v3: torchvision mobilenet_v3_small(width_mult=0.25, num_classes=10) (HardSwish, HardSigmoid,
  squeeze-excitation), `image` 1x3x64x64 -> `logits`
- bert: transformers BertModel (hidden 32, 2 layers, 2 heads, vocab 1000), `input_ids` and `attention_mask` int64
  1x16 -> `last_hidden_state`, `pooler_output`
- gpt2: transformers GPT2LMHeadModel (n_embd 32, 2 layers, 2 heads, vocab 1000, 64 positions, no cache),
  `input_ids` int64 1x16 -> `logits`
- vit: transformers ViTForImageClassification (hidden 32, 2 layers, 2 heads, 32x32 images, 8x8 patches, 10 labels),
  `image` 1x3x32x32 -> `logits`

Exit status: 0 when every selected model was exported, 1 when an export failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
import torchvision
from export_models import OPSET, BertOutputs, export_each, fill_zero_weights, model_names
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, ViTConfig, ViTForImageClassification

DEFAULT_FOLDER = Path(__file__).resolve().parent.parent / "tests" / "exports"
VOCAB = 1000
STATIC_BATCH, STATIC_SEQUENCE = 1, 16
DYNAMIC_BATCH, DYNAMIC_SEQUENCE = 2, 8
CALIBRATION_BATCH = 8
IMAGE_SIZE, VIT_IMAGE_SIZE = 64, 32
TINY_TRANSFORMER = {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 64}


@dataclass(frozen=True)
class TinyExport:
    """One tiny model: the module, example inputs for a batch and sequence length, and, per input, which axes are
    the dynamic `batch` and `seq` dimensions of the dynamic export."""

    module: torch.nn.Module
    inputs: Callable[[int, int], tuple[torch.Tensor, ...]]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: tuple[dict[int, str], ...]


class LogitsOnly(torch.nn.Module):
    """A transformers model returning its `logits` tensor alone, so the exported graph has one named output."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs).logits


def token_ids(batch: int, sequence: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, sequence), dtype=torch.int64)


def vision(builder: Callable[..., torch.nn.Module], **kwargs: object) -> Callable[[], TinyExport]:
    """A torchvision classifier (10 classes), randomly initialised, on IMAGE_SIZE x IMAGE_SIZE RGB images."""

    def export() -> TinyExport:
        return TinyExport(
            builder(weights=None, num_classes=10, **kwargs),
            lambda batch, _: (torch.randn(batch, 3, IMAGE_SIZE, IMAGE_SIZE),),
            ("image",),
            ("logits",),
            ({0: "batch"},),
        )

    return export


def bert() -> TinyExport:
    """A 2-layer BERT of width 32; the mask zeroes the last two positions so that masking has an effect."""
    t = TINY_TRANSFORMER
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=t["hidden"],
        num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"],
        intermediate_size=t["intermediate"],
        max_position_embeddings=64,
    )

    def inputs(batch: int, sequence: int) -> tuple[torch.Tensor, ...]:
        mask = torch.ones(batch, sequence, dtype=torch.int64)
        mask[:, -2:] = 0
        return token_ids(batch, sequence), mask

    return TinyExport(
        BertOutputs(BertModel(config)),
        inputs,
        ("input_ids", "attention_mask"),
        ("last_hidden_state", "pooler_output"),
        ({0: "batch", 1: "seq"}, {0: "batch", 1: "seq"}),
    )


def gpt2() -> TinyExport:
    """A 2-layer causal GPT-2 language model of width 32, without a key/value cache."""
    t = TINY_TRANSFORMER
    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=t["hidden"],
        n_layer=t["layers"],
        n_head=t["heads"],
        n_inner=t["intermediate"],
        n_positions=64,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return TinyExport(
        LogitsOnly(GPT2LMHeadModel(config)),
        lambda batch, sequence: (token_ids(batch, sequence),),
        ("input_ids",),
        ("logits",),
        ({0: "batch", 1: "seq"},),
    )


def vit() -> TinyExport:
    """A 2-layer ViT classifier of width 32 on 32x32 images cut into 8x8 patches."""
    t = TINY_TRANSFORMER
    config = ViTConfig(
        hidden_size=t["hidden"],
        num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"],
        intermediate_size=t["intermediate"],
        image_size=VIT_IMAGE_SIZE,
        patch_size=8,
        num_labels=10,
    )
    return TinyExport(
        LogitsOnly(ViTForImageClassification(config)),
        lambda batch, _: (torch.randn(batch, 3, VIT_IMAGE_SIZE, VIT_IMAGE_SIZE),),
        ("image",),
        ("logits",),
        ({0: "batch"},),
    )


MODELS: dict[str, Callable[[], TinyExport]] = {
    "mobilenet_v2": vision(torchvision.models.mobilenet_v2, width_mult=0.25),
    "mobilenet_v3": vision(torchvision.models.mobilenet_v3_small, width_mult=0.25),
    "bert": bert,
    "gpt2": gpt2,
    "vit": vit,
}


def calibrate_batch_norm(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """Give every BatchNorm a random affine part and the running statistics of `inputs`, then leave it in eval mode.

    A freshly initialised torchvision CNN has running statistics (0, 1) that do not match its activations: they
    shrink layer after layer to logits of ~1e-7, which any engine matches within an absolute 1e-4. Statistics
    measured on the input batch keep every layer's activations near unit scale, so the logits carry signal; random
    scales and shifts make a BatchNormalization (or its folding into a Conv) that drops either one visible."""
    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for norm in norms:
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0.0, 0.1)
            norm.reset_running_stats()
            norm.momentum = None  # a cumulative average: one batch's statistics exactly
        module.train()
        module(*inputs)
    module.eval()


def dynamic_shapes(spec: TinyExport) -> tuple[dict[int, torch.export.Dim], ...]:
    """torch.export's form of spec.dynamic_axes: one Dim object per name, shared by every input that has it."""
    dims = {name: torch.export.Dim(name) for axes in spec.dynamic_axes for name in axes.values()}
    return tuple({axis: dims[name] for axis, name in axes.items()} for axes in spec.dynamic_axes)


def export_one(spec: TinyExport, path: Path, dynamic: bool) -> None:
    """Export spec's module, static at STATIC_BATCH/STATIC_SEQUENCE or dynamic, to `path` and check the file."""
    sizes = (DYNAMIC_BATCH, DYNAMIC_SEQUENCE) if dynamic else (STATIC_BATCH, STATIC_SEQUENCE)
    with torch.no_grad():
        program = torch.onnx.export(
            spec.module,
            spec.inputs(*sizes),
            input_names=list(spec.input_names),
            output_names=list(spec.output_names),
            opset_version=OPSET,
            dynamo=True,
            dynamic_shapes=dynamic_shapes(spec) if dynamic else None,
        )
    program.save(str(path))
    onnx.checker.check_model(str(path))


def export_model(name: str, folder: Path) -> list[Path]:
    """Export one model to `folder/<name>_static.onnx` and `folder/<name>_dynamic.onnx`."""
    torch.manual_seed(0)
    spec = MODELS[name]()
    fill_zero_weights(spec.module)
    calibrate_batch_norm(spec.module, spec.inputs(CALIBRATION_BATCH, STATIC_SEQUENCE))
    paths = []
    for kind in ("static", "dynamic"):
        path = folder / f"{name}_{kind}.onnx"
        export_one(spec, path, kind == "dynamic")
        paths.append(path)
    return paths


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_FOLDER, help=f"default: {DEFAULT_FOLDER}")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default: {','.join(MODELS)})")
    args = parser.parse_args(argv)
    args.models = model_names(parser, args.models, MODELS)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return export_each(args.models, args.output, export_model)


if __name__ == "__main__":
    sys.exit(main())
