"""The tests' fork server (``cli_server.py``) runs a console script as a new interpreter would: the same exit status,
the same lines on stdout and on stderr (numbers aside: times and speeds differ between any two runs), and the same
files written, for fairseq's own scripts (which configure logging before importing fairseq) and the plugin's."""

import os
import re

import pytest
import torch

import helpers
from helpers import PLUGIN, assert_user_error, cli, synthetic_data_bin


def both(monkeypatch, *cmd):
    """(forked, new interpreter): the command run both ways; ``{way}`` in an argument becomes "forked" or "fresh"
    (outputs of their own), and in the outputs the forked run's names read as the fresh run's."""
    runs = {}
    for way in ("forked", "fresh"):
        if way == "fresh":
            monkeypatch.setenv("FAIRSEQ_PE_TEST_FORK", "0")
        runs[way] = cli(*(c.replace("{way}", way) for c in cmd), check=False)
    monkeypatch.delenv("FAIRSEQ_PE_TEST_FORK")
    forked = runs["forked"]
    for c in cmd:
        if "{way}" in c:
            name, fresh_name = c.replace("{way}", "forked"), c.replace("{way}", "fresh")
            forked.stdout, forked.stderr = (s.replace(name, fresh_name) for s in (forked.stdout, forked.stderr))
    return forked, runs["fresh"]


IMPORT_TIME = "Please install tensorboardX"  # logged while fairseq is imported: by the server, once (cli_server.py)


def shape(text):
    """The lines with every number replaced (times, speeds, memory), but the one fairseq logs at its import."""
    return [re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", line) for line in text.splitlines() if IMPORT_TIME not in line]


def assert_same(forked, fresh):
    assert forked.returncode == fresh.returncode, (forked.returncode, fresh.returncode, forked.stderr[-2000:])
    assert shape(forked.stdout) == shape(fresh.stdout), (forked.stdout[-3000:], fresh.stdout[-3000:])
    assert shape(forked.stderr) == shape(fresh.stderr), (forked.stderr[-3000:], fresh.stderr[-3000:])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic_data_bin(tmp_path_factory.mktemp("server"), train_size=40, valid_size=4,
                              test_buckets=[(2, 6)], test_per_bucket=3, seed=5)


def test_fairseq_train_generate_and_a_plugin_tool_as_a_new_interpreter(data, tmp_path, monkeypatch):
    assert helpers._console_script(["fairseq-train"], os.environ["PATH"], None) is not None  # forked, by default
    raw = os.path.join(os.path.dirname(data), "raw")  # synthetic_data_bin's text
    forked, fresh = both(monkeypatch, "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
                         "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--destdir",
                         str(tmp_path / "{way}-bin"), "--joined-dictionary", "--workers", "1")
    assert_same(forked, fresh)
    written = sorted(f for f in os.listdir(tmp_path / "fresh-bin") if f != "preprocess.log")
    assert fresh.returncode == 0 and "train.src-tgt.src.bin" in written
    assert sorted(f for f in os.listdir(tmp_path / "forked-bin") if f != "preprocess.log") == written
    assert all((tmp_path / "forked-bin" / f).read_bytes() == (tmp_path / "fresh-bin" / f).read_bytes() for f in written)
    train = ["fairseq-train", data, "--user-dir", PLUGIN, "--arch", "transformer_pe_tiny", "--pe-relative", "rope",
             "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "300", "--max-update", "2", "--cpu",
             "--num-workers", "0", "--seed", "1", "--log-interval", "1", "--log-format", "simple",
             "--no-epoch-checkpoints"]
    forked, fresh = both(monkeypatch, *train, "--save-dir", str(tmp_path / "{way}"))
    assert_same(forked, fresh)
    assert forked.returncode == 0 and "| train_inner |" in forked.stdout  # fairseq's format, on stdout
    a, b = (torch.load(tmp_path / way / "checkpoint_last.pt", weights_only=False)["model"] for way in ("forked", "fresh"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the same training, to the bit

    ckpt = str(tmp_path / "fresh" / "checkpoint_last.pt")
    assert_same(*both(monkeypatch, "fairseq-generate", data, "--user-dir", PLUGIN, "--path", ckpt, "--gen-subset",
                      "test", "--beam", "2", "--cpu"))
    forked, fresh = both(monkeypatch, "fairseq-validate", data, "--user-dir", PLUGIN, "--task", "translation",
                         "--path", ckpt, "--cpu", "--valid-subset", "valid", "--max-tokens", "300")
    assert_same(forked, fresh)
    assert fresh.returncode == 0 and "| valid on 'valid' subset | loss" in fresh.stdout + fresh.stderr
    # a plugin tool (it imports fairseq itself, then configures logging), to a file of its own each way
    forked, fresh = both(monkeypatch, "fairseq-pe-warm-start-floater", ckpt, str(tmp_path / "{way}.pt"))
    assert_same(forked, fresh)
    assert fresh.returncode == 0 and "Fine-tune with" in fresh.stdout + fresh.stderr
    a, b = (torch.load(tmp_path / f"{way}.pt", weights_only=False)["model"] for way in ("forked", "fresh"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a refusal of the user's: one line, status 2, both ways
    forked, fresh = both(monkeypatch, "fairseq-pe-warm-start-floater", ckpt, str(tmp_path / "fresh.pt"))
    assert_user_error(fresh, "fairseq-pe-warm-start-floater", "--force")
    assert_same(forked, fresh)
    assert_same(*both(monkeypatch, "fairseq-pe-analyze", "--bogus"))
    # a user error raised inside fairseq-generate: one line, status 2, no traceback, both ways
    forked, fresh = both(monkeypatch, "fairseq-generate", data, "--user-dir", PLUGIN, "--path",
                         str(tmp_path / "missing.pt"), "--cpu")
    assert_user_error(fresh, "fairseq-generate", "missing.pt")
    assert_same(forked, fresh)


def test_a_process_that_compiled_with_torch_still_forks_its_runs(monkeypatch):
    """torch's compiler writes variables into its process's environment at its first compilation (tests/test_flex.py
    compiles): a later run of a console script is still forked, not a new interpreter; a variable that a run does
    read at its start still sends it to one."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    for name in helpers.SET_BY_TORCH:
        monkeypatch.delenv(name, raising=False)
    cache_dir()  # what a first compilation does: TORCHINDUCTOR_CACHE_DIR set in os.environ
    assert "TORCHINDUCTOR_CACHE_DIR" in os.environ
    monkeypatch.setenv("KMP_INIT_AT_FORK", "FALSE")  # as torch leaves them after tests/test_flex.py
    monkeypatch.setenv("KMP_DUPLICATE_LIB_OK", "True")
    before = helpers._CLI_SERVER.forked_runs
    proc = cli("fairseq-pe-analyze", "--help")
    assert proc.returncode == 0 and helpers._CLI_SERVER.forked_runs == before + 1
    assert helpers.needs_new_interpreter(dict(os.environ, OMP_NUM_THREADS="2"), helpers._BASE_ENV)
