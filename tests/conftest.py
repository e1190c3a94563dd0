import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:  # pytest-xdist (scripts/run_tests.sh): the cores shared by the workers, not each all of them
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
    config.addinivalue_line(
        "markers",
        "shared_data: reads ../shared/data (the real-data folder next to the checkout) through "
        "helpers.shared_data(); skipped, naming the folder, where it is missing. "
        "`pytest -m shared_data` runs exactly these.")


def _set_current_test(item):
    helpers = sys.modules.get("helpers")  # imported by the test modules that can read ../shared
    if helpers is not None:
        helpers.current_test = item


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _set_current_test(item)  # before the test's fixtures: helpers.shared_data() checks its marker


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    _set_current_test(None)


@pytest.fixture
def cpu_fp16_optimizer(monkeypatch):
    """fairseq's flat FP16Optimizer keys its float32 buffer by ``torch.cuda.current_device()``, which fails without
    CUDA; on CPU parameters have device index None, so the buffer is keyed by None (as fairseq's own tests do)."""
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
