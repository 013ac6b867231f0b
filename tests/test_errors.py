"""Error types carry the exit statuses the CLI documents and name what is wrong."""

from farm.errors import (
    ArtifactError,
    BuildError,
    ExitStatus,
    ModelLoadError,
    RunInputError,
    UnsupportedError,
    redact_url,
)


def test_exit_statuses():
    assert BuildError("x").exit_status == ExitStatus.BUILD_FAILED == 1
    for error in (ModelLoadError("x"), ArtifactError("x"), RunInputError("x"), UnsupportedError("x")):
        assert error.exit_status == ExitStatus.BAD_INPUT == 2


def test_unsupported_error_names_node_op_domain_and_opset():
    error = UnsupportedError("op is not supported by farm", node="n1", op="Hardmax", domain="", opset=13)
    assert str(error) == "node 'n1' (op 'Hardmax', domain 'ai.onnx', opset 13): op is not supported by farm"
    assert (error.node, error.op, error.opset) == ("n1", "Hardmax", 13)


def test_redact_url() -> None:
    assert redact_url("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("rediss://me:pw@host/1") == "rediss://me:***@host/1"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
