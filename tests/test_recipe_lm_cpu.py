"""The CPU language-model extrapolation recipe (scripts/recipes/lm-cpu-extrapolation.sh): a smoke run on a few real
documents with a handful of updates, resumed without work; its QUICK=1 subset read from the catalogue."""

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from fairseq_pe import systems as catalogue
from helpers import REPO, cli, shared_data

RECIPE = os.path.join(REPO, "scripts", "recipes", "lm-cpu-extrapolation.sh")


@pytest.mark.shared_data
def test_lm_cpu_recipe_smoke_and_resume(tmp_path):
    """Whole documents held out, ALiBi trained at L = 16, evaluated at 2L in both modes over every test token (a
    learned table's refusal: tests/test_lm_tools.py); a re-run trains and evaluates nothing again."""
    sotu = shared_data("mono", "en", "sotu")
    data = tmp_path / "text"
    data.mkdir()
    for name in sorted(f for f in os.listdir(sotu) if f.endswith(".txt"))[:12]:
        shutil.copy(os.path.join(sotu, name), data / name)
    work = tmp_path / "work"
    env = dict(DATA=str(data), VOCAB="300", VALID_PERCENT="10", TEST_PERCENT="10", L="16", MAX_UPDATE="3",
               MAX_TOKENS="256", WARMUP="2", SYSTEMS="alibi", SEEDS="1", MULTIPLIERS="2", JOBS="1",
               MODES="nonoverlapping sliding")
    command = ["env", *[f"{k}={v}" for k, v in env.items()], "bash", RECIPE, str(work)]
    out = cli(*command)
    report = json.loads((work / "lengths" / "lengths.json").read_text())
    assert report["train_length"] == 16 and report["lengths"] == [32]
    assert report["modes"] == ["nonoverlapping", "sliding"] and report["gen_subset"] == "test"
    assert report["checkpoints"] == {name: [str(work / "runs" / f"{name}-s1" / "checkpoint_last.pt")]
                                     for name in ("alibi",)}
    alibi = report["results"]["alibi"]
    for mode in ("nonoverlapping", "sliding"):  # every token of the test split, past L
        assert alibi[mode]["32"]["tokens"] == report["split_tokens"] and alibi[mode]["32"]["perplexity"] > 1
    assert alibi["sliding"]["32"]["context_window"] == 16  # windows of 2L scoring their last L tokens
    assert "num_updates 3" in (work / "runs" / "alibi-s1" / "train.log").read_text()
    assert "| alibi" in out.stdout  # the table, at the end
    # resumed: nothing trained or evaluated again, the results untouched
    stamp = os.stat(work / "lengths" / "lengths.json").st_mtime_ns
    again = cli(*command)
    assert "alibi seed 1: trained already" in again.stderr and "evaluated already" in again.stderr
    assert "training (" not in again.stderr and os.stat(work / "lengths" / "lengths.json").st_mtime_ns == stamp


def test_lm_cpu_recipe_quick_subset_and_bad_systems(tmp_path):
    """QUICK=1: the catalogue's lm-wiki103 systems (the GPU recipe's) with their catalogue flags, one seed, L = 64,
    evaluated at 1..32L, non-overlapping, two checkpoints at a time; an unknown system is refused by name before anything runs."""
    env = dict(os.environ, DRY_RUN="1", QUICK="1", PYTHON=sys.executable)
    proc = subprocess.run(["bash", RECIPE, str(tmp_path / "work")], env=env, capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    commands = [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]
    trains = [c for c in commands if c[0] == "fairseq-train"]
    quick = catalogue.group("lm-wiki103")
    assert len(trains) == len(quick) == 5
    for c, (name, flags) in zip(trains, quick.items()):
        assert " ".join(flags) in " ".join(c) and c[c.index("--seed") + 1] == "1"
        assert c[c.index("--tokens-per-sample") + 1] == "64" and c[c.index("--arch") + 1] == "transformer_lm_pe_tiny"
        assert c[c.index("--save-dir") + 1].endswith(f"/runs/{name}-s1")
    lengths = next(c for c in commands if c[0] == "fairseq-pe-lm-lengths")
    assert lengths[lengths.index("--multipliers") + 1:lengths.index("--modes")] == ["1", "2", "4", "8", "16", "32"]
    assert lengths[lengths.index("--modes") + 1] == "nonoverlapping" and lengths[lengths.index("--jobs") + 1] == "2"
    assert [a.split("=")[0] for a in lengths[lengths.index("--checkpoint") + 1:]
            if "=" in a and a.endswith(".pt")] == list(quick)
    assert not (tmp_path / "work").exists()
    bad = subprocess.run(["bash", RECIPE, str(tmp_path / "work")], env=dict(env, SYSTEMS="alibi nosuch"),
                         capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "SYSTEMS: unknown system 'nosuch'" in bad.stderr
    # FoPE's training length is the recipe's L, not the catalogue's 37 (the captions')
    fope = subprocess.run(["bash", RECIPE, str(tmp_path / "work")], env=dict(env, SYSTEMS="fope", L="48"),
                          capture_output=True, text=True, cwd=tmp_path)
    assert fope.returncode == 0, fope.stderr
    train = next(shlex.split(line[2:]) for line in fope.stdout.splitlines() if line.startswith("+ fairseq-train"))
    assert train[train.index("--pe-fope-train-length") + 1] == "48" and train.count("--pe-fope-train-length") == 1
