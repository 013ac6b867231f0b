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

The image size of `resnet18_style` and `mobilenetv2_style` is a parameter (`image=64`); the registry `EXAMPLES`
maps each name above to its builder called with defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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

    def node(self, op: str, inputs: Sequence[str], name: str, output: str | None = None, **attrs: object) -> str:
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


EXAMPLES: dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp": mlp,
    "small_cnn": small_cnn,
    "tiny_cnn": tiny_cnn,
    "resnet18_style": resnet18_style,
    "mobilenetv2_style": mobilenetv2_style,
}


def random_input(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal arrays for each graph input that is not an initializer, keyed by input name."""
    rng = np.random.default_rng(seed)
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
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
