"""The farm over TLS: a redis-server that speaks only TLS (its plain port closed), a certificate from a throwaway CA,
real `farm worker` processes, the CLI and Flower all on one rediss:// URL that names the CA (ssl_ca_certs) and
leaves ssl_cert_reqs to its documented default, `required`. A client without TLS, or trusting another CA, is
refused in one line with exit status 4, a worker included."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import redis
from kombu.exceptions import OperationalError

from farm.distributed import redis_keys
from farm.tools.examples import EXAMPLES
from tests.farm_services import FARM_ACL, PASSWORDS, Farm, farm_cli
from tests.services import TlsFiles, TlsRedisServer, make_tls_files
from tests.test_flower import Flower, poll

PASSWORD = PASSWORDS["submitter"]


@pytest.fixture(scope="module")
def tls_farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    """A TLS-only redis-server with the farm's ACL users, and one worker on its rediss:// URL."""
    folder = tmp_path_factory.mktemp("tls-farm")
    with TlsRedisServer(make_tls_files(folder / "tls"), acl=FARM_ACL) as server:
        farm = Farm(server, folder)
        try:
            farm.add_worker("w1@tls")
            yield farm
        finally:
            farm.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny_cnn.onnx"
    onnx.save(EXAMPLES["tiny_cnn"](), str(path))
    return path


def _one_line_error(result: subprocess.CompletedProcess, status: int, *fragments: str) -> None:
    assert result.returncode == status, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("farm: error: ") and PASSWORD not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def _with_ca(url: str, ca: Path) -> str:
    return f"{url.partition('?')[0]}?ssl_ca_certs={ca}"


def test_nothing_travels_in_clear(tls_farm: Farm) -> None:
    assert tls_farm.url.startswith("rediss://") and "ssl_cert_reqs" not in tls_farm.url
    client = redis.Redis.from_url(tls_farm.redis.url, decode_responses=True)
    assert client.config_get("port") == {"port": "0"}  # the plain port is closed
    assert client.exists(redis_keys.lease_key("w1@tls")) == 1  # the worker's lease keeper renews over TLS


def test_submit_wait_download_and_run_over_tls(tls_farm: Farm, model: Path, tmp_path: Path) -> None:
    import onnxruntime

    submitted = farm_cli("submit", str(model), "--no-wait", "--json", broker=tls_farm.url, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr + tls_farm.logs()
    job_id = json.loads(submitted.stdout)["job_id"]
    waited = farm_cli("wait", job_id, broker=tls_farm.url, cwd=tmp_path)
    assert waited.returncode == 0, waited.stderr + tls_farm.logs()
    downloaded = farm_cli("download", job_id, "-o", str(tmp_path / "dl"), broker=tls_farm.url, cwd=tmp_path)
    assert downloaded.returncode == 0, downloaded.stderr
    artifact = Path(downloaded.stdout.strip())
    assert artifact.parent == tmp_path / "dl" and artifact.is_file()

    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ran = subprocess.run(
        [sys.executable, "-m", "farm", "run", str(artifact), "--input", "input=x.npy", "-o", "out.npz"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    reference = onnxruntime.InferenceSession(str(model)).run(None, {"input": x})[0]
    assert np.abs(np.load(tmp_path / "out.npz")["output"] - reference).max() <= 1e-4


def test_flower_reads_the_farm_over_tls(tls_farm: Farm, tmp_path: Path) -> None:
    """Flower takes the TLS options from the app (broker_use_ssl): its worker list comes over the broker's events,
    its queue lengths from its own Redis client."""
    flower = Flower(tls_farm.flower_url, tmp_path)
    try:
        flower.wait_until_up()
        status, workers = poll(
            lambda: flower.get("/api/workers?refresh=true"),
            lambda answer: answer[0] == 200 and "w1@tls" in (answer[1] or {}),
        )
        assert status == 200 and "w1@tls" in workers, flower.log()
        status, queues = flower.get("/api/queues/length")
        assert status == 200 and "control" in {queue["name"] for queue in queues["active_queues"]}, flower.log()
    finally:
        flower.stop()


def test_a_plain_client_is_refused_by_the_tls_port(tls_farm: Farm, model: Path, tmp_path: Path) -> None:
    plain = tls_farm.url.partition("?")[0].replace("rediss://", "redis://", 1)
    _one_line_error(
        farm_cli("submit", str(model), broker=plain, cwd=tmp_path), 4, "redis://farm-submitter:***@127.0.0.1"
    )


def test_a_server_certificate_from_another_ca_is_refused_in_one_line(
    tls_farm: Farm, model: Path, tmp_path: Path
) -> None:
    wrong: TlsFiles = make_tls_files(tmp_path / "wrong")
    url = _with_ca(tls_farm.url, wrong.ca)
    expected = ("failed TLS verification", "certificate", "ssl_ca_certs")
    _one_line_error(farm_cli("submit", str(model), broker=url, cwd=tmp_path), 4, *expected)
    _one_line_error(
        farm_cli("submit", str(model), broker=tls_farm.url.partition("?")[0], cwd=tmp_path), 4, *expected
    )  # no ssl_ca_certs: the system's CAs don't know the test CA either
    worker = farm_cli("worker", "--hostname", "wrong-ca@tls", broker=url, cwd=tmp_path, timeout=60)
    _one_line_error(worker, 4, *expected)  # at once: no retry fixes a certificate


def test_celerys_broker_and_result_backend_verify_the_server_certificate(tls_farm: Farm, tmp_path: Path) -> None:
    """The worker's own check refuses a wrong CA before Celery starts, so Celery's clients are tried here directly:
    kombu's broker connection and the result backend's client trust the URL's CA and nothing else."""
    from farm.distributed.celery_app import make_app

    right = make_app(tls_farm.url)
    with right.connection_for_write() as connection:
        connection.ensure_connection(max_retries=0)
    assert right.backend.client.ping()
    wrong = make_app(_with_ca(tls_farm.url, make_tls_files(tmp_path / "wrong").ca))
    with wrong.connection_for_write() as connection, pytest.raises(OperationalError, match="certificate verify failed"):
        connection.ensure_connection(max_retries=0)
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        wrong.backend.client.ping()


@pytest.mark.parametrize(
    ("query", "named"),
    [("ssl_cert_reqs=sometimes", "ssl_cert_reqs"), ("ssl_ca_certs=/no/such/ca.pem", "ssl_ca_certs /no/such/ca.pem")],
)
def test_tls_parameters_that_cannot_work_are_bad_input(
    tls_farm: Farm, model: Path, tmp_path: Path, query: str, named: str
) -> None:
    url = f"{tls_farm.url.partition('?')[0]}?{query}"
    _one_line_error(farm_cli("submit", str(model), broker=url, cwd=tmp_path), 2, named)
