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
    config.addinivalue_line(
        "markers",
        "fresh_interpreter: runs its console scripts as new interpreters through their installed wrappers "
        "(tests/fresh_subset.py; `pytest -m fresh_interpreter` runs exactly these).")


def _subset_name(item):
    """``FILE::NAME[PARAMETERS]`` of a test under tests/, as tests/fresh_subset.py names it."""
    file, sep, rest = item.nodeid.partition("::")
    return os.path.basename(file) + sep + rest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the tests of tests/fresh_subset.py; a name there that matches no collected test of a file collected whole
    (not by test names: ``FILE::TEST``) is an error: a test renamed or a parameter changed would otherwise leave its
    console scripts unchecked.  (-k and -m deselect after this.)"""
    import fresh_subset

    names = {_subset_name(item): item for item in items}
    by_name = {os.path.basename(a.partition("::")[0]) for a in config.args if "::" in a}
    files = {name.partition("::")[0] for name in names} - by_name
    missing = [t for t in fresh_subset.tests() if t.partition("::")[0] in files and t not in names]
    if missing:
        raise pytest.UsageError(f"tests/fresh_subset.py names tests that do not exist: {', '.join(missing)}")
    for test in fresh_subset.tests():
        if test in names:
            names[test].add_marker("fresh_interpreter")


def _fresh_start(item):
    """For a test of the fresh subset: ``FAIRSEQ_PE_TEST_FORK=0`` while it runs (its fixtures included), and an empty
    record of the console scripts run fresh (``helpers.FRESH_RUNS``)."""
    import fresh_subset

    helpers = sys.modules.get("helpers")
    if helpers is not None:
        helpers.FRESH_RUNS.clear()
    name = _subset_name(item)
    if fresh_subset.expected_scripts(name) and not name.startswith(fresh_subset.BOTH_WAYS):
        item._fresh_env = os.environ.get("FAIRSEQ_PE_TEST_FORK")
        os.environ["FAIRSEQ_PE_TEST_FORK"] = "0"


def _fresh_end(item):
    if hasattr(item, "_fresh_env"):
        if item._fresh_env is None:
            os.environ.pop("FAIRSEQ_PE_TEST_FORK", None)
        else:
            os.environ["FAIRSEQ_PE_TEST_FORK"] = item._fresh_env


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test of the fresh subset that passed without running each of its console scripts in a new interpreter
    fails."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed:
        return
    import fresh_subset

    expected = fresh_subset.expected_scripts(_subset_name(item))
    helpers = sys.modules.get("helpers")
    ran = set(helpers.FRESH_RUNS) if helpers is not None else set()
    if set(expected) - ran:
        report.outcome = "failed"
        report.longrepr = (f"tests/fresh_subset.py: {_subset_name(item)} must run {', '.join(sorted(set(expected) - ran))}"
                           f" in a new interpreter (helpers.cli with FAIRSEQ_PE_TEST_FORK=0); it ran "
                           f"{', '.join(sorted(ran)) or 'none'} that way")


def _set_current_test(item):
    helpers = sys.modules.get("helpers")  # imported by the test modules that can read ../shared
    if helpers is not None:
        helpers.current_test = item


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _set_current_test(item)  # before the test's fixtures: helpers.shared_data() checks its marker
    _fresh_start(item)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    _set_current_test(None)
    _fresh_end(item)


@pytest.fixture
def cpu_fp16_optimizer(monkeypatch):
    """fairseq's flat FP16Optimizer keys its float32 buffer by ``torch.cuda.current_device()``, which fails without
    CUDA; on CPU parameters have device index None, so the buffer is keyed by None (as fairseq's own tests do)."""
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
