"""Example ONNX models built in code: used by the tests, the benchmarks and the bundled example in examples/.

Every builder returns an `onnx.ModelProto` with opset 17 and IR version 8 (so that onnxruntime accepts it), float32
values and static shapes, one input named "input" and one output named "output". Weights are drawn from a numpy
generator with a fixed seed, so building a model twice gives the same bytes. Weights use He-style scaling and
batch-norm parameters stay near the identity (positive variance), so outputs keep a moderate size.

| name               | input             | output      | what                                                  |
| ------------------ | ----------------- | ----------- | ----------------------------------------------------- |
| `mlp`              | (1, 784)          | (1, 10)     | 3 x (Gemm + Relu), Gemm, Softmax                      |
| `small_cnn`        | (1, 3, 32, 32)    | (1, 10)     | Conv+Relu, MaxPool, Conv+BN+Relu, GAP, Flatten, Gemm  |
| `tiny_cnn`         | (1, 3, 32, 32)    | (1, 10)     | 2 x (Conv+Relu, MaxPool), Flatten, Gemm, Softmax      |
| `resnet18_style`   | (1, 3, 64, 64)    | (1, 1000)   | ResNet-18 layout: 4 stages of 2 basic blocks          |
| `mobilenetv2_style`| (1, 3, 64, 64)    | (1, 1000)   | MobileNetV2 layout: inverted residuals, Clip(0, 6)    |
| `bert_style`       | 2 x (1, 32) int64 | (1, 32, 128)| BERT encoder: Gather embeddings, 4 x (attention, GELU) |
| `vit_style`        | (1, 3, 32, 32)    | (1, 10)     | ViT: strided-Conv patches, class token, 4 blocks      |

The image size of `resnet18_style` and `mobilenetv2_style` is a parameter (`image=64`); the registry `EXAMPLES`
maps each name above to its builder called with defaults. `bert_style` takes `input_ids` and `attention_mask`
(int64) and gives `output`; its model properties `farm.example.range.<input>` bound the integers `random_input`
draws (token ids below the vocabulary size, a 0/1 mask).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
BN_EPSILON = 1e-5


class _GraphBuilder:
    """Accumulates nodes and initializers of one graph; names follow PyTorch's module names (layer1.0.conv1)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: set[str] = set()

    # -- plumbing ------------------------------------------------------------------------------------------------

    def _unique(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"duplicate name {name!r} in example graph")
        self._names.add(name)
        return name

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(array, order="C"), self._unique(name)))
        return name

    def node(self, op: str, inputs: Sequence[str], name: str, output: str | None = None, **attrs: Any) -> str:
        out = self._unique(output or name)
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=name, **attrs))
        return out

    def he_normal(self, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    # -- layers --------------------------------------------------------------------------------------------------

    def conv(
        self,
        x: str,
        name: str,
        cin: int,
        cout: int,
        kernel: int,
        stride: int = 1,
        group: int = 1,
        bias: bool = False,
    ) -> str:
        fan_in = (cin // group) * kernel * kernel
        inputs = [x, self.const(f"{name}.weight", self.he_normal((cout, cin // group, kernel, kernel), fan_in))]
        if bias:
            inputs.append(self.const(f"{name}.bias", (self.rng.standard_normal(cout) * 0.05).astype(np.float32)))
        pad = kernel // 2
        return self.node(
            "Conv",
            inputs,
            name,
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad, pad, pad, pad],
            dilations=[1, 1],
            group=group,
        )

    def bn(self, x: str, name: str, channels: int, gamma: tuple[float, float] = (0.5, 1.5)) -> str:
        rng = self.rng
        scale = rng.uniform(*gamma, channels).astype(np.float32)
        shift = (rng.standard_normal(channels) * 0.1).astype(np.float32)
        mean = (rng.standard_normal(channels) * 0.1).astype(np.float32)
        var = rng.uniform(0.5, 1.5, channels).astype(np.float32)
        inputs = [
            x,
            self.const(f"{name}.weight", scale),
            self.const(f"{name}.bias", shift),
            self.const(f"{name}.running_mean", mean),
            self.const(f"{name}.running_var", var),
        ]
        return self.node("BatchNormalization", inputs, name, epsilon=BN_EPSILON, momentum=0.9)

    def relu(self, x: str, name: str) -> str:
        return self.node("Relu", [x], name)

    def clip6(self, x: str, name: str) -> str:
        """ReLU6 as Clip with min/max as constant inputs (opset >= 11); one shared pair of scalars per graph."""
        if "clip.min" not in self._names:
            self.const("clip.min", np.array(0.0, dtype=np.float32))
            self.const("clip.max", np.array(6.0, dtype=np.float32))
        return self.node("Clip", [x, "clip.min", "clip.max"], name)

    def maxpool(self, x: str, name: str, kernel: int, stride: int, pad: int = 0) -> str:
        return self.node(
            "MaxPool", [x], name, kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad, pad, pad, pad]
        )

    def gap_flatten(self, x: str) -> str:
        return self.node("Flatten", [self.node("GlobalAveragePool", [x], "avgpool")], "flatten", axis=1)

    def gemm(self, x: str, name: str, fin: int, fout: int, output: str | None = None) -> str:
        weight = self.const(f"{name}.weight", self.he_normal((fout, fin), fin))
        bias = self.const(f"{name}.bias", (self.rng.standard_normal(fout) * 0.05).astype(np.float32))
        return self.node("Gemm", [x, weight, bias], name, output=output, alpha=1.0, beta=1.0, transB=1)

    def model(self, name: str, input_shape: Sequence[int], output_shape: Sequence[int], doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(input_shape))],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(output_shape))],
            initializer=self.initializers,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            ir_version=IR_VERSION,
            producer_name="farm.examples",
            doc_string=doc,
        )
        return model


# -- builders ----------------------------------------------------------------------------------------------------


def mlp(
    batch: int = 1,
    features: int = 784,
    hidden: Sequence[int] = (512, 256, 128),
    classes: int = 10,
    seed: int = 0,
) -> onnx.ModelProto:
    """Multi-layer perceptron: (batch, features) -> Gemm+Relu per hidden layer (3 by default), Gemm, Softmax
    -> (batch, classes) class probabilities."""
    g = _GraphBuilder(seed)
    x, fin = "input", features
    for i, width in enumerate(hidden):
        x = g.relu(g.gemm(x, f"fc{i + 1}", fin, width), f"relu{i + 1}")
        fin = width
    x = g.gemm(x, f"fc{len(hidden) + 1}", fin, classes)
    g.node("Softmax", [x], "softmax", output="output", axis=-1)
    return g.model("mlp", (batch, features), (batch, classes), mlp.__doc__ or "")


def small_cnn(image: int = 32, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """Small CNN: (1, 3, image, image) -> Conv+Relu, MaxPool, Conv+BN+Relu, GlobalAveragePool, Flatten, Gemm
    -> (1, classes) logits."""
    g = _GraphBuilder(seed)
    x = g.relu(g.conv("input", "conv1", 3, 16, 3, bias=True), "relu1")
    x = g.maxpool(x, "pool1", 2, 2)
    x = g.relu(g.bn(g.conv(x, "conv2", 16, 32, 3), "bn2", 32), "relu2")
    x = g.gap_flatten(x)
    g.gemm(x, "fc", 32, classes, output="output")
    return g.model("small_cnn", (1, 3, image, image), (1, classes), small_cnn.__doc__ or "")


def tiny_cnn(seed: int = 0) -> onnx.ModelProto:
    """The bundled example (examples/tiny_cnn.onnx): (1, 3, 32, 32) -> Conv(8)+Relu, MaxPool, Conv(16)+Relu,
    MaxPool, Flatten, Gemm, Softmax -> (1, 10) class probabilities."""
    g = _GraphBuilder(seed)
    x = g.maxpool(g.relu(g.conv("input", "conv1", 3, 8, 3, bias=True), "relu1"), "pool1", 2, 2)  # 8 x 16 x 16
    x = g.maxpool(g.relu(g.conv(x, "conv2", 8, 16, 3, bias=True), "relu2"), "pool2", 2, 2)  # 16 x 8 x 8
    x = g.node("Flatten", [x], "flatten", axis=1)
    x = g.gemm(x, "fc", 16 * 8 * 8, 10)
    g.node("Softmax", [x], "softmax", output="output", axis=-1)
    return g.model("tiny_cnn", (1, 3, 32, 32), (1, 10), tiny_cnn.__doc__ or "")


def _basic_block(g: _GraphBuilder, x: str, name: str, cin: int, cout: int, stride: int) -> str:
    out = g.relu(g.bn(g.conv(x, f"{name}.conv1", cin, cout, 3, stride), f"{name}.bn1", cout), f"{name}.relu1")
    # The residual branch's last BN starts small (as zero-init-gamma training does) so the sum stays moderate.
    out = g.bn(g.conv(out, f"{name}.conv2", cout, cout, 3), f"{name}.bn2", cout, gamma=(0.2, 0.5))
    shortcut = x
    if stride != 1 or cin != cout:
        shortcut = g.bn(g.conv(x, f"{name}.downsample.0", cin, cout, 1, stride), f"{name}.downsample.1", cout)
    return g.relu(g.node("Add", [out, shortcut], f"{name}.add"), f"{name}.relu2")


def resnet18_style(image: int = 64, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 layout: (1, 3, image, image) -> Conv7x7/2+BN+Relu, MaxPool3x3/2, 4 stages of 2 basic blocks
    (64-128-256-512 channels, stride 2 with a 1x1 Conv+BN shortcut at the start of stages 2-4), GlobalAveragePool,
    Flatten, Gemm -> (1, classes) logits. Blocks of the same shape are built alike, so identical kernels repeat."""
    g = _GraphBuilder(seed)
    x = g.relu(g.bn(g.conv("input", "conv1", 3, 64, 7, 2), "bn1", 64), "relu")
    x = g.maxpool(x, "maxpool", 3, 2, 1)
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            stride = 2 if (block == 0 and stage > 1) else 1
            x = _basic_block(g, x, f"layer{stage}.{block}", cin, cout, stride)
            cin = cout
    x = g.gap_flatten(x)
    g.gemm(x, "fc", 512, classes, output="output")
    return g.model("resnet18_style", (1, 3, image, image), (1, classes), resnet18_style.__doc__ or "")


# (expansion t, output channels c, repeats n, first stride s), as in the MobileNetV2 paper, trimmed.
_MOBILENETV2_BLOCKS: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 2, 2),
    (6, 96, 2, 1),
)


def _inverted_residual(g: _GraphBuilder, x: str, name: str, cin: int, cout: int, stride: int, expand: int) -> str:
    hidden = cin * expand
    out = x
    if expand != 1:
        out = g.bn(g.conv(out, f"{name}.expand", cin, hidden, 1), f"{name}.expand_bn", hidden)
        out = g.clip6(out, f"{name}.relu6a")
    out = g.conv(out, f"{name}.depthwise", hidden, hidden, 3, stride, group=hidden)
    out = g.clip6(g.bn(out, f"{name}.depthwise_bn", hidden), f"{name}.relu6b")
    out = g.bn(g.conv(out, f"{name}.project", hidden, cout, 1), f"{name}.project_bn", cout, gamma=(0.2, 0.5))
    if stride == 1 and cin == cout:
        out = g.node("Add", [x, out], f"{name}.add")
    return out


def mobilenetv2_style(image: int = 64, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 layout: (1, 3, image, image) -> Conv3x3/2+BN+Clip(0,6), inverted residual blocks (1x1 expand
    +BN+Clip, depthwise 3x3 +BN+Clip, 1x1 project +BN, Add when stride 1 and channels match), 1x1 Conv to 1280
    +BN+Clip, GlobalAveragePool, Flatten, Gemm -> (1, classes) logits. Clip takes min/max as constant inputs."""
    g = _GraphBuilder(seed)
    x = g.clip6(g.bn(g.conv("input", "stem", 3, 32, 3, 2), "stem_bn", 32), "stem_relu6")
    cin, index = 32, 0
    for expand, cout, repeats, first_stride in _MOBILENETV2_BLOCKS:
        for r in range(repeats):
            x = _inverted_residual(g, x, f"block{index}", cin, cout, first_stride if r == 0 else 1, expand)
            cin, index = cout, index + 1
    x = g.clip6(g.bn(g.conv(x, "head", cin, 1280, 1), "head_bn", 1280), "head_relu6")
    x = g.gap_flatten(x)
    g.gemm(x, "classifier", 1280, classes, output="output")
    return g.model("mobilenetv2_style", (1, 3, image, image), (1, classes), mobilenetv2_style.__doc__ or "")


class _TransformerBuilder(_GraphBuilder):
    """Transformer layers as an exporter writes them: MatMul + Add, Reshape/Transpose for heads, Erf-form GELU."""

    def dense(self, x: str, name: str, fin: int, fout: int) -> str:
        weight = self.const(f"{name}.weight", (self.rng.standard_normal((fin, fout)) / np.sqrt(fin)).astype(np.float32))
        bias = self.const(f"{name}.bias", (self.rng.standard_normal(fout) * 0.02).astype(np.float32))
        return self.node("Add", [self.node("MatMul", [x, weight], f"{name}.matmul"), bias], name)

    def layer_norm(self, x: str, name: str, width: int) -> str:
        scale = self.const(f"{name}.weight", self.rng.uniform(0.8, 1.2, width).astype(np.float32))
        shift = self.const(f"{name}.bias", (self.rng.standard_normal(width) * 0.02).astype(np.float32))
        return self.node("LayerNormalization", [x, scale, shift], name, axis=-1, epsilon=1e-12)

    def gelu(self, x: str, name: str) -> str:
        """0.5 * x * (1 + erf(x / sqrt 2)), the form BERT exports carry."""
        if "gelu.sqrt2" not in self._names:
            self.const("gelu.sqrt2", np.array(np.sqrt(2.0), np.float32))
            self.const("gelu.one", np.array(1.0, np.float32))
            self.const("gelu.half", np.array(0.5, np.float32))
        erf = self.node("Erf", [self.node("Div", [x, "gelu.sqrt2"], f"{name}.div")], f"{name}.erf")
        scaled = self.node("Mul", [x, self.node("Add", [erf, "gelu.one"], f"{name}.add")], f"{name}.mul")
        return self.node("Mul", [scaled, "gelu.half"], name)

    def split_heads(self, x: str, name: str, seq: int, heads: int, head_dim: int, perm: Sequence[int]) -> str:
        shape = self.const(f"{name}.shape", np.array([1, seq, heads, head_dim], np.int64))
        return self.node("Transpose", [self.node("Reshape", [x, shape], f"{name}.reshape")], name, perm=list(perm))

    def attention(self, x: str, name: str, seq: int, width: int, heads: int, mask: str | None) -> str:
        """Multi-head self-attention: softmax(Q K^T / sqrt(d) + mask) V, heads merged, output projection."""
        head_dim = width // heads
        q = self.split_heads(
            self.dense(x, f"{name}.query", width, width), f"{name}.q", seq, heads, head_dim, (0, 2, 1, 3)
        )
        k = self.split_heads(
            self.dense(x, f"{name}.key", width, width), f"{name}.k", seq, heads, head_dim, (0, 2, 3, 1)
        )
        v = self.split_heads(
            self.dense(x, f"{name}.value", width, width), f"{name}.v", seq, heads, head_dim, (0, 2, 1, 3)
        )
        scale = self.const(f"{name}.scale", np.array(np.sqrt(head_dim), np.float32))
        scores = self.node("Div", [self.node("MatMul", [q, k], f"{name}.scores"), scale], f"{name}.scaled")
        if mask is not None:
            scores = self.node("Add", [scores, mask], f"{name}.masked")
        probs = self.node("Softmax", [scores], f"{name}.softmax", axis=-1)
        context = self.node(
            "Transpose", [self.node("MatMul", [probs, v], f"{name}.context")], f"{name}.merge", perm=[0, 2, 1, 3]
        )
        shape = self.const(f"{name}.merged_shape", np.array([1, seq, width], np.int64))
        return self.dense(self.node("Reshape", [context, shape], f"{name}.merged"), f"{name}.output", width, width)

    def mlp_block(self, x: str, name: str, width: int, hidden: int) -> str:
        return self.dense(
            self.gelu(self.dense(x, f"{name}.fc1", width, hidden), f"{name}.gelu"), f"{name}.fc2", hidden, width
        )

    def additive_mask(self, mask: str) -> str:
        """(1 - mask) * -10000 as float, shaped [1, 1, 1, seq] to broadcast over heads and query positions."""
        as_float = self.node("Cast", [mask], "mask.cast", to=TensorProto.FLOAT)
        one = self.const("mask.one", np.array(1.0, np.float32))
        big = self.const("mask.big", np.array(-10000.0, np.float32))
        inverted = self.node("Sub", [one, as_float], "mask.invert")
        axes = self.const("mask.axes", np.array([1, 2], np.int64))
        return self.node("Unsqueeze", [self.node("Mul", [inverted, big], "mask.scale"), axes], "mask.additive")


def _typed_model(
    builder: _GraphBuilder,
    name: str,
    inputs: Sequence[onnx.ValueInfoProto],
    output_shape: Sequence[int],
    doc: str,
    ranges: dict[str, tuple[int, int]] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        builder.nodes,
        name,
        list(inputs),
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(output_shape))],
        initializer=builder.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="farm.examples",
        doc_string=doc,
    )
    helper.set_model_props(model, {f"farm.example.range.{k}": f"{lo} {hi}" for k, (lo, hi) in (ranges or {}).items()})
    return model


def bert_style(
    seq: int = 32, width: int = 128, heads: int = 4, layers: int = 4, vocab: int = 1000, seed: int = 0
) -> onnx.ModelProto:
    """A BERT encoder: token + position + segment embeddings (Gather), LayerNorm, `layers` post-norm blocks of
    multi-head attention (additive mask from attention_mask) and a GELU MLP."""
    g = _TransformerBuilder(seed)
    table = lambda rows: (g.rng.standard_normal((rows, width)) * 0.1).astype(np.float32)  # noqa: E731
    tokens = g.node("Gather", [g.const("embeddings.word", table(vocab)), "input_ids"], "embeddings.tokens")
    positions = g.node(
        "Gather",
        [
            g.const("embeddings.position", table(512)),
            g.const("embeddings.position_ids", np.arange(seq, dtype=np.int64)[None, :]),
        ],
        "embeddings.positions",
    )
    x = g.layer_norm(g.node("Add", [tokens, positions], "embeddings.sum"), "embeddings.norm", width)
    mask = g.additive_mask("attention_mask")
    for layer in range(layers):
        name = f"encoder.{layer}"
        x = g.layer_norm(
            g.node("Add", [x, g.attention(x, f"{name}.attention", seq, width, heads, mask)], f"{name}.residual1"),
            f"{name}.norm1",
            width,
        )
        x = g.layer_norm(
            g.node("Add", [x, g.mlp_block(x, f"{name}.mlp", width, 4 * width)], f"{name}.residual2"),
            f"{name}.norm2",
            width,
        )
    g.node("Identity", [x], "output")
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, [1, seq]) for n in ("input_ids", "attention_mask")]
    return _typed_model(
        g,
        "bert_style",
        inputs,
        (1, seq, width),
        bert_style.__doc__ or "",
        {"input_ids": (0, vocab), "attention_mask": (0, 2)},
    )


def vit_style(
    image: int = 32, patch: int = 4, width: int = 64, heads: int = 4, layers: int = 4, classes: int = 10, seed: int = 0
) -> onnx.ModelProto:
    """A ViT: patch embedding by a strided Conv, Reshape/Transpose to tokens, a class token by Concat, position
    embeddings, `layers` pre-norm attention blocks, and a linear head on the class token."""
    g = _TransformerBuilder(seed)
    patches = (image // patch) ** 2
    weight = g.const("patch.weight", g.he_normal((width, 3, patch, patch), 3 * patch * patch))
    bias = g.const("patch.bias", (g.rng.standard_normal(width) * 0.02).astype(np.float32))
    x = g.node("Conv", ["input", weight, bias], "patch", kernel_shape=[patch, patch], strides=[patch, patch])
    x = g.node("Reshape", [x, g.const("patch.shape", np.array([1, width, patches], np.int64))], "patch.flat")
    x = g.node("Transpose", [x], "patch.tokens", perm=[0, 2, 1])
    cls = g.const("cls_token", (g.rng.standard_normal((1, 1, width)) * 0.1).astype(np.float32))
    x = g.node("Concat", [cls, x], "tokens", axis=1)
    positions = g.const("position", (g.rng.standard_normal((1, patches + 1, width)) * 0.1).astype(np.float32))
    x = g.node("Add", [x, positions], "embedded")
    for layer in range(layers):
        name = f"blocks.{layer}"
        attended = g.attention(
            g.layer_norm(x, f"{name}.norm1", width), f"{name}.attention", patches + 1, width, heads, None
        )
        x = g.node("Add", [x, attended], f"{name}.residual1")
        x = g.node(
            "Add",
            [x, g.mlp_block(g.layer_norm(x, f"{name}.norm2", width), f"{name}.mlp", width, 2 * width)],
            f"{name}.residual2",
        )
    x = g.layer_norm(x, "norm", width)
    first = g.const("cls_index", np.array(0, np.int64))
    x = g.node("Gather", [x, first], "cls", axis=1)
    weight = g.const("head.weight", g.he_normal((width, classes), width))
    head_bias = g.const("head.bias", (g.rng.standard_normal(classes) * 0.02).astype(np.float32))
    g.node("Add", [g.node("MatMul", [x, weight], "head.matmul"), head_bias], "head", output="output")
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, image, image])]
    return _typed_model(g, "vit_style", inputs, (1, classes), vit_style.__doc__ or "")


EXAMPLES: dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp": mlp,
    "small_cnn": small_cnn,
    "tiny_cnn": tiny_cnn,
    "resnet18_style": resnet18_style,
    "mobilenetv2_style": mobilenetv2_style,
    "bert_style": bert_style,
    "vit_style": vit_style,
}


def random_input(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal arrays for each float graph input that is not an initializer, keyed by input name; integer
    inputs draw from the model property `farm.example.range.<name>` ("low high", default 0 2)."""
    rng = np.random.default_rng(seed)
    ranges = {p.key.removeprefix("farm.example.range."): p.value for p in model.metadata_props}
    initializers = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = []
        for dim in tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                raise ValueError(f"input {value.name!r} has a dynamic dimension {dim.dim_param!r}; need static shapes")
            shape.append(dim.dim_value)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        if dtype.kind in "iub":
            low, high = (int(bound) for bound in ranges.get(value.name, "0 2").split())
            feeds[value.name] = rng.integers(low, high, shape).astype(dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
