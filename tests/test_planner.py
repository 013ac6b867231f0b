"""The planner (farm/plan/planner.py): shared kernels for identical layers, deduplicated blobs, scratch buffers."""

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.build.assembly import plan_model
from farm.errors import UnsupportedError


def conv_chain(tmp_path, layers: int = 4, same_weights: bool = False):
    """x -> (Conv 3x3 + Relu) * layers, every layer the same shape."""
    rng = np.random.default_rng(0)
    shared = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        weight = shared if same_weights else rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{i}"))
        nodes += [
            helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
        ]
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)],
        initializer=inits,
    )
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return plan_model(path)


def test_identical_layers_share_one_kernel(tmp_path):
    plan = conv_chain(tmp_path, layers=4)
    assert len(plan.steps) == 4
    assert len(plan.kernels()) == 1
    assert len(plan.blobs) == 4


def test_equal_weights_share_one_blob(tmp_path):
    assert len(conv_chain(tmp_path, layers=3, same_weights=True).blobs) == 1


def test_scratch_buffer_for_im2col(tmp_path):
    plan = conv_chain(tmp_path, layers=1)
    scratch = [arg.name for arg in plan.steps[0].args if arg.name.endswith("::scratch")]
    assert scratch and plan.memory.sizes[scratch[0]] >= 8 * 9 * 16 * 16 * 4


def relu_chain(path, nodes: int, reverse: bool = False):
    """x -> Relu -> Relu -> ... (`nodes` of them), saved at `path`; listed last to first when `reverse`."""
    chain = [helper.make_node("Relu", [f"v{i - 1}" if i else "x"], [f"v{i}"], name=f"relu{i}") for i in range(nodes)]
    graph = helper.make_graph(
        chain[::-1] if reverse else chain,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(f"v{nodes - 1}", TensorProto.FLOAT, None)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


class _LineBudget:
    """Counts the lines run in one module while active and fails once they pass `limit`: a structural measure of an
    algorithm's cost (a quadratic scan runs n**2 lines) that doesn't depend on the machine's speed."""

    def __init__(self, module, limit: int):
        self.filename, self.limit, self.lines = module.__file__, limit, 0

    def _local(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            assert self.lines <= self.limit, f"over {self.limit} lines run in {self.filename}"
        return self._local

    def _global(self, frame, event, arg):
        return self._local if frame.f_code.co_filename == self.filename else None

    def __enter__(self):
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)


def test_a_long_chain_plans_its_memory_in_linear_steps(tmp_path):
    """Planning stays near-linear in the node count (issue 13: a 20,000-node chain took over a minute when every
    placement scanned every buffer placed before it, 2*10**8 steps). The seconds per node count are measured by
    benchmarks/bench_plan.py; this counts the lines the memory plan runs."""
    from farm.plan import memory

    plan = plan_model(relu_chain(tmp_path / "chain.onnx", 20_000))
    assert len(plan.steps) == 20_000
    with _LineBudget(memory, limit=60 * 20_000) as budget:
        again = memory.plan_memory(plan.graph, plan.steps)
    assert again.offsets == plan.memory.offsets and budget.lines > 20_000
    assert plan.memory.arena_bytes <= 3 * 64  # the input pointer slot, two 32-byte activations aligned taking turns


def test_a_chain_listed_backwards_is_ordered_in_linear_steps(tmp_path):
    """An unsorted graph is put in order by counting each node's undefined inputs, not by rescanning every pending
    node each round (which made a reversed 20,000-node chain quadratic)."""
    from farm.frontend import onnx_import

    path = relu_chain(tmp_path / "reversed.onnx", 20_000, reverse=True)
    with _LineBudget(onnx_import, limit=200 * 20_000):
        graph = onnx_import.import_model(path)
    assert [node.name for node in graph.nodes] == [f"relu{i}" for i in range(20_000)]


def residual_blocks(
    tmp_path,
    blocks: int = 2,
    *,
    reread: bool = False,
    residual_is_input: bool = False,
    output_is_block: bool = False,
    from_model_input: bool = False,
):
    """x -> Relu -> `blocks` times (Conv 3x3 of Relu(a), Add a, Relu) -> Sigmoid: each residual is an activation that
    dies at the conv, so the conv writes over it. `reread`: the Sigmoid's Mul also reads the first block's input;
    `residual_is_input`: Add(conv(a), a), the conv's own input; `output_is_block`: no Sigmoid, the last block's
    output is the model's; `from_model_input`: no first Relu, the first residual is the model's input."""
    rng = np.random.default_rng(1)
    first = "x" if from_model_input else "a0"
    nodes, inits, prev = [] if from_model_input else [helper.make_node("Relu", ["x"], ["a0"])], [], first
    for i in range(blocks):
        inits.append(numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1, f"w{i}"))
        source = prev
        if not residual_is_input:
            nodes.append(helper.make_node("Relu", [prev], [f"b{i}"]))
            source = f"b{i}"
        nodes += [
            helper.make_node("Conv", [source, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
            helper.make_node("Add", [f"c{i}", prev], [f"s{i}"]),
            helper.make_node("Relu", [f"s{i}"], [f"a{i + 1}"]),
        ]
        prev = f"a{i + 1}"
    if not output_is_block:
        nodes.append(helper.make_node("Sigmoid", [prev], ["y"]))
        prev = "y"
    if reread:
        nodes.append(helper.make_node("Mul", [prev, first], ["m"]))
        prev = "m"
    graph = helper.make_graph(
        nodes,
        "residuals",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)],
        initializer=inits,
    )
    path = tmp_path / "residuals.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _residual_kinds(path) -> list:
    return [step.spec.attrs["residual"] for step in plan_model(path).steps if step.spec.op == "Conv"]


def test_a_conv_writes_over_a_residual_that_dies_there(tmp_path):
    """The conv's spec says so (no residual input), its output is the residual's buffer, and the next block reads
    it there: the blocks' outputs have no buffer of their own."""
    plan = plan_model(residual_blocks(tmp_path))
    convs = [step for step in plan.steps if step.spec.op == "Conv"]
    assert [step.spec.attrs["residual"] for step in convs] == ["in_place", "in_place"]
    assert [len(step.spec.inputs) for step in convs] == [2, 2]  # x and the weight: no bias, no residual
    assert [step.args[0].name for step in convs] == ["a0", "a0"]
    assert [arg.name for arg in plan.steps[-1].args] == ["y", "a0"]
    assert not {"a1", "a2"} & set(plan.memory.offsets)


def test_a_residual_read_later_or_by_the_conv_itself_is_kept(tmp_path):
    """The first block's input read again after the blocks (reread), or the conv's own input: no conv may write over
    it; the second block's residual still dies at its conv."""
    assert _residual_kinds(residual_blocks(tmp_path, reread=True)) == [True, "in_place"]
    assert _residual_kinds(residual_blocks(tmp_path, residual_is_input=True)) == [True, True]


def test_a_model_input_or_output_is_never_written_over(tmp_path):
    """A residual that is the model's input (the caller's feed) and a conv whose output is the model's output (its
    own slot) keep their buffers."""
    assert _residual_kinds(residual_blocks(tmp_path, from_model_input=True)) == [True, "in_place"]
    plan = plan_model(residual_blocks(tmp_path, output_is_block=True))
    assert [step.spec.attrs["residual"] for step in plan.steps if step.spec.op == "Conv"] == ["in_place", True]
    assert "a2" in plan.memory.offsets


def _save(tmp_path, nodes, inputs, outputs, initializers=()):
    """A model of `nodes` over graph inputs (name, shape) of float32 and float32 initializers, saved for plan_model."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in initializers],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_a_node_that_writes_only_empty_tensors_gets_no_step(tmp_path):
    """Its outputs are model outputs all the same: each keeps a buffer (of no bytes, ALIGNMENT in the arena)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
        helper.make_node("Split", ["a", "parts"], ["p", "q"], name="split", axis=1),
    ]
    path = _save(
        tmp_path, nodes, [("x", [0, 3]), ("a", [2, 4])], ["y", "p", "q"], [("parts", np.array([4, 0], np.int64))]
    )
    plan = plan_model(path)
    assert [step.node for step in plan.steps] == ["split"]  # a Split with one empty part still writes the other
    assert {"x", "y", "p", "q"} <= set(plan.memory.offsets)
    assert plan.memory.sizes["y"] == plan.memory.sizes["q"] == 64


def test_an_empty_constant_is_an_arena_argument_not_a_blob(tmp_path):
    """A blob of no bytes has no object to link and no OpenCL buffer to upload; the kernel never reads it."""
    nodes = [helper.make_node("Concat", ["x", "e"], ["y"], name="concat", axis=0)]
    plan = plan_model(_save(tmp_path, nodes, [("x", [2, 3])], ["y"], [("e", np.zeros((0, 3), np.float32))]))
    assert not plan.blobs
    assert [(arg.kind, arg.name) for arg in plan.steps[0].args] == [("arena", "y"), ("arena", "x"), ("arena", "e")]


def test_an_op_whose_kernel_takes_no_empty_operand_is_refused(tmp_path):
    """A MatMul over an empty inner axis is all zeros, but its kernel was not written for it: refused, not guessed."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")]
    with pytest.raises(
        UnsupportedError,
        match=r"'matmul'.*input 'x' is empty \(shape \[2, 0\]\) and the node "
        r"computes a non-empty output; farm's MatMul kernel is not written",
    ):
        plan_model(_save(tmp_path, nodes, [("x", [2, 0]), ("w", [0, 3])], ["y"]))


def test_constants_are_hashed_on_threads_to_the_digests_a_serial_hash_gives(tmp_path) -> None:
    """constant_digests hashes every constant a kernel takes as data (in a thread pool); the plan's blobs are keyed
    by exactly those sha256s of the bytes they hold."""
    import hashlib

    from farm.frontend.onnx_import import import_model
    from farm.frontend.passes import optimize
    from farm.plan.planner import constant_digests
    from farm.tools.examples import EXAMPLES

    path = tmp_path / "small_cnn.onnx"
    onnx.save(EXAMPLES["small_cnn"](), path)
    graph = optimize(import_model(path))
    digests = constant_digests(graph)
    plan = plan_model(path)
    assert set(digests.values()) == set(plan.blobs) and len(digests) >= len(plan.blobs) > 0
    for name, sha in digests.items():
        data = np.ascontiguousarray(graph.constants[name]).reshape(-1).view(np.uint8)
        assert hashlib.sha256(data.tobytes()).hexdigest() == sha
        assert plan.blobs[sha].tobytes() == data.tobytes()


def test_a_known_digest_is_taken_only_while_its_constant_is_the_array_it_was_read_into(tmp_path) -> None:
    """A farm job's weights come by digest (Graph.known_digests): planning doesn't hash them again, but a pass that
    replaced a constant makes it hash that one (a stale digest would name other bytes)."""
    from farm.frontend.onnx_import import import_model
    from farm.plan.planner import constant_digests
    from farm.tools.examples import EXAMPLES

    path = tmp_path / "small_cnn.onnx"
    onnx.save(EXAMPLES["small_cnn"](), path)
    graph = import_model(path)
    hashed = constant_digests(graph)
    first, second = sorted(hashed)[:2]
    graph.known_digests = {
        first: (graph.constants[first], "f" * 64),
        second: (graph.constants[second].copy(), "e" * 64),
    }
    digests = constant_digests(graph)
    assert digests[first] == "f" * 64  # taken as given: the array is the one the digest came with
    assert digests[second] == hashed[second]  # another array now: hashed
