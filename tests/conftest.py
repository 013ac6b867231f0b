"""Shared test set-up.

Under CI (env CI=true or CI=1) a skipped test is a failure: a test that cannot run there (a missing package, a
service that did not start) must not pass silently. Expected failures (xfail) are left alone. Skips raised while
collecting a module (pytest.skip(allow_module_level=True), pytest.importorskip) become collection errors.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

pytest_plugins = ["pytester"]

SERVICE_FIXTURES = frozenset(
    {
        "redis_server",
        "redis_servers",
        "farm_factory",
        "farm_redis",
        "tls_farm",
        "flower_for",
        "secured",
        "deployed_redis",
    }
)
"""Fixtures that start real services (redis-server, Celery workers, Flower): a test using one, directly or through
another fixture, is marked `services` (pytest_collection_modifyitems); tests/services.py refuses to start a server
for a test that isn't."""

SESSION_CACHE_MARK = "FARM_TEST_SESSION_CACHE_DIR"
"""Names the cache root a test session made, so sessions started inside it keep it (pytest_configure)."""


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1"}


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, lineno, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


def _fail_skip(report: pytest.TestReport | pytest.CollectReport, what: str) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"{what} was skipped, and skips count as failures under CI={os.environ.get('CI')}: {_skip_reason(report)}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    if _ci() and report.skipped and not hasattr(report, "wasxfail"):
        _fail_skip(report, f"test {item.nodeid}")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport:
    report: pytest.CollectReport = yield
    if _ci() and report.skipped:
        _fail_skip(report, f"collection of {collector.nodeid or collector.name}")
    return report


@pytest.fixture
def onnx_model_path(tmp_path: Path) -> Callable[..., Path]:
    """Factory: save a ModelProto under tmp_path and return the file's path."""

    def save(model: onnx.ModelProto, name: str = "model.onnx") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
        return path

    return save


@pytest.fixture(scope="session")
def light_models_dir() -> Path:
    """The folder of small real-world models (light_*.onnx, with reference outputs) that the onnx package ships."""
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    if not path.is_dir():
        pytest.fail(f"the onnx package has no {path}; reinstall onnx")
    return path


def pytest_configure(config: pytest.Config) -> None:
    """Give the whole session (and the farm processes it starts) a throwaway cache root, even when FARM_CACHE_DIR is
    set: the local store there is the compile cache, whose objects are keyed by CODEGEN_VERSION, not by farm's
    source, so a session must not link objects that an earlier session's code compiled. A session started inside
    this one (an xdist worker, a pytester run) keeps the root this one made."""
    if os.environ.get("FARM_CACHE_DIR") and os.environ.get(SESSION_CACHE_MARK) == os.environ["FARM_CACHE_DIR"]:
        return
    folder = tempfile.mkdtemp(prefix="farm-test-cache-")
    os.environ["FARM_CACHE_DIR"] = os.environ[SESSION_CACHE_MARK] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.fixture(scope="session")
def small_cnn_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples.small_cnn saved once per session: the small model most build tests build."""
    from farm.tools import examples

    path = tmp_path_factory.mktemp("model") / "small_cnn.onnx"
    onnx.save(examples.small_cnn(), path)
    return path


@pytest.fixture(scope="session")
def fingerprint() -> str:
    """The fingerprint of this host's first OpenCL device (PoCL here); no device is a failure, never a skip."""
    from farm.backends.opencl.devices import opencl_devices

    devices = opencl_devices()
    assert devices, "no OpenCL device: install pocl-opencl-icd (scripts/setup.sh does)"
    return devices[0]["fingerprint"]


SLOWEST_FILES = (
    "test_tuning_variants.py",
    "test_conformance.py",
    "test_llvm_gemm.py",
    "test_models.py",
    "test_farm.py",
    "test_cli.py",
    "test_ops_conv.py",
    "test_ops_elementwise.py",
    "test_jobs.py",
    "test_workers.py",
    "test_ops_tensor.py",
    "test_emulation.py",
    "test_ops_reduce.py",
    "test_exports.py",
    "test_tuning_space.py",
    "test_farm_store.py",
    "test_ops_indexing.py",
    "test_hosts.py",
    "test_flower.py",
    "test_tls.py",
    "test_runtime_opencl.py",
    "test_local.py",
    "test_manifest.py",
    "test_store.py",
    "test_farm_data.py",
    "test_install.py",
    "test_ops_quantize.py",
    "test_ops_normalization.py",
    "test_ops_pool.py",
    "test_acl.py",
    "test_client.py",
    "test_bench.py",
    "test_ops_attention.py",
    "test_deploy.py",
    "test_ops_softmax.py",
    "test_ops_matmul.py",
)
"""The test files that take longest, about longest first (a full run's --durations, 2-core host), run before the
others: scripts/test.sh hands whole files to its pytest-xdist workers in collection order (--dist loadfile
--no-loadscope-reorder), so a long file can't start last and keep one worker busy after the rest are done.
test_tuning_variants.py goes first: most of its time is the tuning-lock test's production timeout (120 s), a wait
that the files started beside it fill; those are the ones that only compute (conformance, GEMM, models), not the
farm and CLI files, which wait too. Files not listed follow in their usual order."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `services` every test whose fixtures start a service (SERVICE_FIXTURES); put the SLOWEST_FILES' tests
    first, longest file first (each file's tests stay together and in order)."""
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)
    rank = {name: index for index, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_FILES)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Let tests/services.py start servers while a test marked `services` runs (its set-up and tear-down too)."""
    from tests import services

    services.starting_allowed_for = item.nodeid if item.get_closest_marker("services") else None
    try:
        return (yield)
    finally:
        services.starting_allowed_for = None
