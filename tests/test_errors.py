"""Error types carry the exit statuses the CLI documents and name what is wrong."""

from farm.errors import ArtifactError, BuildError, ExitStatus, ModelLoadError, RunInputError, UnsupportedError


def test_exit_statuses():
    assert BuildError("x").exit_status == ExitStatus.BUILD_FAILED == 1
    for error in (ModelLoadError("x"), ArtifactError("x"), RunInputError("x"), UnsupportedError("x")):
        assert error.exit_status == ExitStatus.BAD_INPUT == 2


def test_unsupported_error_names_node_op_domain_and_opset():
    error = UnsupportedError("op is not supported by farm", node="n1", op="Hardmax", domain="", opset=13)
    assert str(error) == "node 'n1' (op 'Hardmax', domain 'ai.onnx', opset 13): op is not supported by farm"
    assert (error.node, error.op, error.opset) == ("n1", "Hardmax", 13)
