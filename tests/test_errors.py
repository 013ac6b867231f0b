"""Error types carry the exit statuses the CLI documents and name what is wrong."""

from farm.errors import (
    ArtifactError,
    BuildError,
    CredentialsRefusedError,
    ExitStatus,
    ModelLoadError,
    RunInputError,
    UnreachableError,
    UnsupportedError,
    credentials_refused,
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


def test_refused_credentials_name_the_url_and_whether_its_password_is_missing_or_wrong() -> None:
    assert credentials_refused("redis://h:6379/0") == (
        "the farm's Redis at redis://h:6379/0 refused the connection: the URL lacks the password the server requires")
    assert credentials_refused("redis://:pw@h:6379/0") == (
        "the farm's Redis at redis://:***@h:6379/0 refused the connection: the URL has a wrong password (or user)")
    error = CredentialsRefusedError("redis://:pw@h:6379/0")
    assert isinstance(error, UnreachableError) and error.exit_status == ExitStatus.UNREACHABLE == 4
    assert str(error) == credentials_refused("redis://:pw@h:6379/0")
