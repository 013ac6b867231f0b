"""Export the real architectures of issue 14's model table to ONNX with torch.onnx, for benchmarks/bench_speed.py.

The speed goal of issue 14 is stated on torch.onnx exports of real models, not only on graphs built with
onnx.helper: the exporter's graphs carry the shapes, op patterns (Gemm vs MatMul + Add, Erf-based Gelu, LayerNorm,
attention's reshapes and transposes) that users feed the farm. Nothing is downloaded: every model is randomly
initialised (torchvision `weights=None`, transformers from its default config, seeded with torch.manual_seed(0)),
which is all a latency benchmark needs. A weight matrix that the architecture's own initialisation leaves all zero
(ViT-B/16's classification head) is drawn from N(0, 0.02) instead, so that every output carries signal and an
engine's output can be compared with another's (a zero output agrees with anything).

Every model is exported at batch 1 with static shapes, in eval mode, through torch's default (dynamo) exporter at
opset 18, the lowest it implements: asked for 17 it exports at 18 and down-converts, and that conversion left
resnet18 at 18 without an error, while onnx's own converter wrote an invalid ReduceMean for mobilenet_v2 (torch
2.14.1, onnx 1.23.2), so there is no opset option. One file per model, `<name>.onnx` in the
folder given by `-o`; a model whose weights would not fit in one protobuf (2 GB) is written with external data
beside it (none of these is that large).

Models: resnet50, resnet18, mobilenet_v2, convnext_tiny, vit_b_16 (input `image`, float32 1x3x224x224, output
`logits`) and bert-base (inputs `input_ids` and `attention_mask`, int64 1x128; outputs `last_hidden_state` and
`pooler_output`).

Run it with a Python that has torch, torchvision, transformers, onnx and onnxscript (not farm's own venv, which
stays torch-free). torch and torchvision must come from one index: pypi's torchvision wheels link the CUDA build's
libraries, so beside a `+cpu` torch `import torchvision` fails with "operator torchvision::nms does not exist"
(measured with torch 2.14.1 and torchvision 0.29.1, both from pypi):

    python scripts/export_models.py -o /work/models                    # every model
    python scripts/export_models.py -o /work/models --models resnet18,bert-base

then benchmark them: `python benchmarks/bench_speed.py --onnx /work/models/resnet18.onnx --onnx ...`.
Exit status: 0 when every selected model was exported, 1 when an export failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
import torchvision
from transformers import BertConfig, BertModel

IMAGE_SIZE = 224
SEQUENCE = 128
PROTOBUF_LIMIT = 2 * 1024**3
ZERO_WEIGHT_STD = 0.02
OPSET = 18


@dataclass(frozen=True)
class Export:
    """What torch.onnx.export needs for one model: the module, example inputs and the graph's names."""

    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


class BertOutputs(torch.nn.Module):
    """BertModel returning a plain tuple, so the exported graph has two named outputs and no output dict."""

    def __init__(self, model: BertModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return outputs.last_hidden_state, outputs.pooler_output


def vision(builder: Callable[..., torch.nn.Module]) -> Callable[[], Export]:
    """A torchvision classifier, randomly initialised, on one 224x224 RGB image."""

    def export() -> Export:
        image = torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE)
        return Export(builder(weights=None), (image,), ("image",), ("logits",))

    return export


def bert_base() -> Export:
    """BERT-base (12 layers, width 768, 12 heads) from transformers' default BertConfig, sequence 128."""
    input_ids = torch.randint(0, 100, (1, SEQUENCE), dtype=torch.int64)
    attention_mask = torch.ones(1, SEQUENCE, dtype=torch.int64)
    return Export(
        BertOutputs(BertModel(BertConfig())),
        (input_ids, attention_mask),
        ("input_ids", "attention_mask"),
        ("last_hidden_state", "pooler_output"),
    )


MODELS: dict[str, Callable[[], Export]] = {
    "resnet50": vision(torchvision.models.resnet50),
    "resnet18": vision(torchvision.models.resnet18),
    "mobilenet_v2": vision(torchvision.models.mobilenet_v2),
    "convnext_tiny": vision(torchvision.models.convnext_tiny),
    "vit_b_16": vision(torchvision.models.vit_b_16),
    "bert-base": bert_base,
}


def fill_zero_weights(module: torch.nn.Module) -> None:
    """Draw every all-zero weight matrix (2 or more dimensions; zero biases stay) from N(0, ZERO_WEIGHT_STD)."""
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.dim() >= 2 and not parameter.any():
                parameter.normal_(0.0, ZERO_WEIGHT_STD)


def export_model(name: str, folder: Path) -> Path:
    """Export one model to `folder/<name>.onnx` and check the written file with onnx.checker."""
    torch.manual_seed(0)
    spec = MODELS[name]()
    module = spec.module.eval()
    fill_zero_weights(module)
    path = folder / f"{name}.onnx"
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    with torch.no_grad():
        program = torch.onnx.export(
            module,
            spec.inputs,
            input_names=list(spec.input_names),
            output_names=list(spec.output_names),
            opset_version=OPSET,
            dynamo=True,
        )
    program.save(str(path), external_data=weights >= PROTOBUF_LIMIT)
    onnx.checker.check_model(str(path))
    return path


def model_names(parser: argparse.ArgumentParser, text: str, known: Collection[str] = MODELS) -> list[str]:
    """The comma-separated names of --models; unknown ones are refused with the list of `known` ones."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        parser.error(f"unknown models {unknown}; known: {', '.join(known)}")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, required=True, help="folder to write <model>.onnx files into")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default: {','.join(MODELS)})")
    args = parser.parse_args(argv)
    args.models = model_names(parser, args.models)
    if args.output.exists() and not args.output.is_dir():
        parser.error(f"-o {args.output}: exists and is not a folder")
    return args


def export_each(names: Sequence[str], folder: Path, export: Callable[[str, Path], list[Path]]) -> int:
    """Export every model of `names` into `folder` with `export(name, folder)` (the files it wrote), printing each
    file and its size; 1 when any export failed, after trying the rest (one model's exporter failure must not lose
    the others' exports)."""
    folder.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in names:
        try:
            paths = export(name, folder)
        except Exception:
            traceback.print_exc()
            print(f"{name}: export failed", file=sys.stderr)
            failed.append(name)
            continue
        for path in paths:
            print(f"{name}: {path} ({path.stat().st_size / 1e6:.2f} MB)", flush=True)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return export_each(args.models, args.output, lambda name, folder: [export_model(name, folder)])


if __name__ == "__main__":
    sys.exit(main())
