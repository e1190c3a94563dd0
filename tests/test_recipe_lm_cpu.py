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
from helpers import REPO, cli, shared_data, dry_run

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
    proc, commands = dry_run(RECIPE, tmp_path, QUICK="1")
    assert proc.returncode == 0, proc.stderr
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
    bad, _ = dry_run(RECIPE, tmp_path, QUICK="1", SYSTEMS="alibi nosuch")
    assert bad.returncode == 2 and "SYSTEMS: unknown system 'nosuch'" in bad.stderr
    # FoPE's training length is the recipe's L, not the catalogue's 37 (the captions')
    fope, _ = dry_run(RECIPE, tmp_path, QUICK="1", SYSTEMS="fope", L="48")
    assert fope.returncode == 0, fope.stderr
    train = next(shlex.split(line[2:]) for line in fope.stdout.splitlines() if line.startswith("+ fairseq-train"))
    assert train[train.index("--pe-fope-train-length") + 1] == "48" and train.count("--pe-fope-train-length") == 1


def _text_folder(root, documents=12, lines=60, seed=0):
    """Documents of made-up sentences over 60 words, enough for a 120-piece sentencepiece model."""
    import random

    rng = random.Random(seed)
    words = [rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") + rng.choice("lnrst") + rng.choice(["", "a", "e"])
             for _ in range(60)]
    root.mkdir()
    for d in range(documents):
        text = "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(5, 14))).capitalize() + "."
                         for _ in range(lines))
        (root / f"doc{d:02d}.txt").write_text(text + "\n")
    return root


def test_an_interrupted_training_resumes_from_its_last_checkpoint_to_the_same_model(tmp_path):
    """Killed after its first interval checkpoint (and its checkpoint_last.pt truncated, as a kill during fairseq's
    copy leaves it), a rerun resumes from the interval checkpoint (fairseq's restore: its data position, Adam's
    state and the seed of each update) and ends with the parameters of a run never interrupted, its log appended; a
    run whose command changed (MAX_UPDATE) starts again.  Catches: the directory removed before a rerun (the log
    would have one start), the log overwritten, the command check skipped (the changed run resumed), or the
    truncated file resumed from (fairseq fails to load it)."""
    import signal
    import time

    import torch

    data = _text_folder(tmp_path / "text")
    env = dict(os.environ, PYTHON=sys.executable, DATA=str(data), VOCAB="120", VALID_PERCENT="10",
               TEST_PERCENT="10", L="16", MAX_UPDATE="24", MAX_TOKENS="128", WARMUP="2", SYSTEMS="alibi", SEEDS="1",
               MULTIPLIERS="1", JOBS="1", SAVE_EVERY="4", PATH=os.pathsep.join([os.path.dirname(sys.executable),
                                                                                  os.environ["PATH"]]))
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    subprocess.run(["bash", RECIPE, str(whole)], env=env, check=True, capture_output=True)
    shutil.copytree(whole / "data", cut / "data")  # the same data: the recipe reuses a prepared folder
    run_log = cut / "runs" / "alibi-s1" / "train.log"
    proc = subprocess.Popen(["bash", RECIPE, str(cut)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if run_log.exists() and "Saved checkpoint" in run_log.read_text():
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run_log.parent / "train.done").exists(), "the run ended before it was interrupted"
    # as if killed while fairseq copied its interval checkpoint to checkpoint_last.pt: a truncated file
    last = run_log.parent / "checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    again = subprocess.run(["bash", RECIPE, str(cut)], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "alibi seed 1: resuming from" in again.stderr and "did not load: resuming from" in again.stderr
    log = run_log.read_text()
    assert log.count("fairseq_cli.train | task: ") == 2 and "Loaded checkpoint" in log  # two starts, one log
    assert "num_updates 24" in log
    theirs = torch.load(whole / "runs" / "alibi-s1" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    mine = torch.load(run_log.parent / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert mine["model"].keys() == theirs["model"].keys()
    for key in theirs["model"]:
        torch.testing.assert_close(mine["model"][key], theirs["model"][key], rtol=0, atol=0, msg=key)
    # a changed command does not resume an interrupted run: it starts again
    (run_log.parent / "train.done").unlink()
    changed = subprocess.run(["bash", RECIPE, str(cut)], env=dict(env, MAX_UPDATE="8"), capture_output=True,
                             text=True)
    assert changed.returncode == 0, changed.stderr[-3000:]
    assert "resuming" not in changed.stderr and run_log.read_text().count("fairseq_cli.train | task: ") == 1


def test_the_context_scale_trains_the_pilots_size_and_evaluates_both_modes_and_stride_one(tmp_path):
    """SCALE=context (issue 58): the catalogue's lm-context systems, 3 seeds, transformer_lm_pe_small for 2,500
    updates of 2,048 tokens, validated and saved every 250 updates; evaluated at 1-16 x L in both modes, then with
    ALiBi's stride 1 at L.  Catches a preset that drops one of these (e.g. the saves an interrupted run resumes
    from)."""
    proc, commands = dry_run(RECIPE, tmp_path, SCALE="context")
    assert proc.returncode == 0, proc.stderr
    trains = [c for c in commands if c[0] == "fairseq-train"]
    systems = catalogue.group("lm-context")
    assert len(trains) == 3 * len(systems) and "fire-dape" in systems and "floater-bias" in systems
    for c in trains:
        value = {flag: c[c.index(flag) + 1] for flag in ("--arch", "--max-update", "--max-tokens",
                                                          "--validate-interval-updates", "--save-interval-updates")}
        assert value == {"--arch": "transformer_lm_pe_small", "--max-update": "2500", "--max-tokens": "2048",
                         "--validate-interval-updates": "250", "--save-interval-updates": "250"}
    lengths = [c for c in commands if c[0] == "fairseq-pe-lm-lengths"]
    assert len(lengths) == 2
    first, stride_one = lengths
    assert first[first.index("--modes") + 1:first.index("--modes") + 3] == ["nonoverlapping", "sliding"]
    assert first[first.index("--multipliers") + 1:first.index("--modes")] == ["1", "2", "4", "8", "16"]
    assert stride_one[stride_one.index("--stride") + 1] == "1" and stride_one[stride_one.index("--modes") + 1] == "sliding"
    assert stride_one[stride_one.index("--out") + 1].endswith("/lengths-stride1")
    bad, _ = dry_run(RECIPE, tmp_path, SCALE="huge")
    assert bad.returncode == 2 and "SCALE=huge" in bad.stderr


PILOT = os.path.join(REPO, "scripts", "recipes", "lm-cpu-pilot.sh")


def test_the_pilot_trains_each_size_and_reads_its_curves_and_positions(tmp_path):
    """lm-cpu-pilot.sh: `none` and ALiBi at the three sizes (the medium one the small architecture at 192 dims), one
    seed, validated every 250 updates; fairseq-pe-lm-curves over every log with `none` the reference, then the loss
    by position of every last checkpoint at L and 4L; an unknown size is refused by name before anything runs.
    Catches a size's flags lost (the medium run trained at 128 dims) or a run left out of the curves."""
    proc, commands = dry_run(PILOT, tmp_path)
    assert proc.returncode == 0, proc.stderr
    trains = [c for c in commands if c[0] == "fairseq-train"]
    sizes = [(c[c.index("--arch") + 1], c[c.index("--decoder-embed-dim") + 1] if "--decoder-embed-dim" in c else None)
             for c in trains]
    assert sizes == [("transformer_lm_pe_tiny", None)] * 2 + [("transformer_lm_pe_small", None)] * 2 \
        + [("transformer_lm_pe_small", "192")] * 2
    assert all(c[c.index("--validate-interval-updates") + 1] == "250" and c[c.index("--seed") + 1] == "1"
               for c in trains)
    curves = next(c for c in commands if c[0] == "fairseq-pe-lm-curves")
    runs = curves[curves.index("--run") + 1:curves.index("--reference")]
    assert [r.split("=")[0] for r in runs] == [f"{s}/{n}" for s in ("tiny", "small", "medium") for n in ("none", "alibi")]
    assert curves[curves.index("--reference") + 1] == "none"
    lengths = next(c for c in commands if c[0] == "fairseq-pe-lm-lengths")
    assert lengths[lengths.index("--multipliers") + 1:lengths.index("--modes")] == ["1", "4"]
    assert len([a for a in lengths if a.endswith("checkpoint_last.pt")]) == 6
    assert not (tmp_path / "work").exists()
    bad, _ = dry_run(PILOT, tmp_path, SIZES="tiny huge")
    assert bad.returncode == 2 and "SIZES: unknown size 'huge'" in bad.stderr and not bad.stdout  # nothing printed
