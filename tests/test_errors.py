"""Error types carry the exit statuses the CLI documents and name what is wrong."""

import ssl

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
    tls_refused,
    tls_verification_failure,
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
    assert (
        redact_url("rediss://me:pw@host:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/farm/ca.pem")
        == "rediss://me:***@host:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/farm/ca.pem"
    )


def test_refused_credentials_name_the_url_and_whether_its_password_is_missing_or_wrong() -> None:
    assert credentials_refused("redis://h:6379/0") == (
        "the farm's Redis at redis://h:6379/0 refused the connection: the URL lacks the password the server requires"
    )
    assert credentials_refused("redis://:pw@h:6379/0") == (
        "the farm's Redis at redis://:***@h:6379/0 refused the connection: the URL has a wrong password (or user)"
    )
    error = CredentialsRefusedError("redis://:pw@h:6379/0")
    assert isinstance(error, UnreachableError) and error.exit_status == ExitStatus.UNREACHABLE == 4
    assert str(error) == credentials_refused("redis://:pw@h:6379/0")


def test_a_certificate_failure_is_found_behind_a_clients_connection_error() -> None:
    """redis-py raises its ConnectionError while handling the ssl module's error, so the cause is in the chain."""
    try:
        try:
            raise ssl.SSLCertVerificationError(1, "certificate verify failed")
        except ssl.SSLError as failure:
            raise ConnectionError(f"Error 1 connecting to h:6380. {failure}") from None
    except ConnectionError as error:
        caught = error
    assert isinstance(tls_verification_failure(caught), ssl.SSLCertVerificationError)
    assert tls_verification_failure(ConnectionError("Connection refused")) is None
    message = tls_refused("rediss://:pw@h:6380/0", ssl.SSLCertVerificationError(1, "verify failed"))
    assert message.startswith("the farm's Redis at rediss://:***@h:6380/0 failed TLS verification: ")
    assert "ssl_ca_certs" in message
