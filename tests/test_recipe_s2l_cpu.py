"""Smoke test of the real-data S2L recipe (scripts/recipes/s2l-cpu-en-de.sh) with a handful of updates."""

import json
import os

import pytest

from helpers import REPO, cli, shared_data


def take(src_prefix, n, dest_prefix):
    for lang in ("en", "de"):
        with open(f"{src_prefix}.{lang}", encoding="utf-8") as f:
            lines = f.read().splitlines()[:n]
        with open(f"{dest_prefix}.{lang}", "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


@pytest.mark.shared_data
def test_s2l_cpu_recipe_smoke(tmp_path):
    base = shared_data("mt", "en-de")
    data = tmp_path / "data"
    data.mkdir()
    take(os.path.join(base, "tatoeba", "tatoeba-v2021-08-07"), 500, str(data / "tatoeba"))
    # 30 news pairs: 31 long test pairs, every bin non-empty (150 gave 115, 69 of them in [140,inf), decoded at up
    # to 1.5 x length + 10 tokens: most of the test's time)
    take(os.path.join(base, "wmt", "newstest2020.de-en"), 30, str(data / "news2020"))
    take(os.path.join(base, "iwslt14", "IWSLT14.TED.tst2010"), 9, str(tmp_path / "ted"))
    work = tmp_path / "work"
    env = dict(DATA=str(data), SPM_VOCAB="600", VALID_SIZE="20", SHORT_TEST_SIZE="8", MAX_UPDATE="4",
               MAX_TOKENS="1000", WARMUP="2", SYSTEMS="ape-sinusoidal floater")
    out = cli("env", *[f"{k}={v}" for k, v in env.items()], "bash",
              os.path.join(REPO, "scripts", "recipes", "s2l-cpu-en-de.sh"), str(work),
              "--extra-test", f"ted={tmp_path / 'ted.en'},{tmp_path / 'ted.de'}", "--beam", "1",
              "--progress-seconds", "0")
    stats = json.loads((work / "split" / "stats.json").read_text())
    assert stats["test_short"] == 8 and stats["valid"] == 20 and stats["threshold"] == 80
    assert all(n > 0 for n in stats["test_bins"].values()), stats["test_bins"]  # every bin is scored
    res = json.loads((work / "runs" / "results.json").read_text())
    assert res["buckets"] == ["[80,100)", "[100,120)", "[120,140)", "[140,inf)"]
    for name in ("ape-sinusoidal", "floater"):
        row = res["systems"][name]
        assert [row[b]["n"] for b in res["buckets"]] == list(stats["test_bins"].values())
        assert row["all"]["n"] == stats["test"]
        assert row["short"]["n"] == 8 and row["ted"]["n"] == 9  # held-back short set and the extra corpus
    assert "update 1/4" in out.stdout and "update 4/4" in out.stdout  # progress during and after training
    assert "| floater " in out.stdout and "ted (n=9)" in out.stdout
    # next to BLEU: the references' loss per bin, on the same sentences; one seed, and it says so
    assert "loss of the references" in out.stdout and "ONE training seed (1)" in out.stdout
    for name in ("ape-sinusoidal", "floater"):
        loss = res["loss"][name]
        assert [loss[b]["n"] for b in res["buckets"]] == list(stats["test_bins"].values())
        assert loss["short"]["n"] == 8 and loss["short"]["nll"] > 0
    assert (work / "runs" / "results.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.shared_data
def test_s2l_cpu_captions_recipe_with_two_seeds(tmp_path):
    """The caption/Tatoeba recipe: a split at 20 sentencepiece tokens, two seeds combined."""
    base = shared_data("mt", "en-de")
    data = tmp_path / "data"
    # 300 pairs: 202 long test pairs (700 gave 503, decoded once per seed)
    for corpus, prefix, n in (("multi30k", "train", 200), ("tatoeba", "tatoeba-v2021-08-07", 100)):
        (data / corpus).mkdir(parents=True)
        take(os.path.join(base, corpus, prefix), n, str(data / corpus / prefix))
    work = tmp_path / "work"
    env = dict(DATA=str(data), SPM_VOCAB="500", VALID_SIZE="20", SHORT_TEST_SIZE="10", MAX_UPDATE="3",
               MAX_TOKENS="1000", WARMUP="2", SEEDS="1 2", SYSTEMS="ape-sinusoidal", BINS="20,25+")
    out = cli("env", *[f"{k}={v}" for k, v in env.items()], "bash",
              os.path.join(REPO, "scripts", "recipes", "s2l-cpu-captions.sh"), str(work), "--beam", "1",
              "--progress-seconds", "0")
    stats = json.loads((work / "split" / "stats.json").read_text())
    assert stats["unit"] == "subword" and stats["threshold"] == 20
    res = json.loads((work / "runs" / "results.json").read_text())
    assert res["seeds"] == [1, 2] and res["length_unit"] == "sentencepiece tokens"
    row = res["systems"]["ape-sinusoidal"]
    assert row["all"]["n"] == stats["test"] and len(row["all"]["bleu_seeds"]) == 2
    assert "mean ± standard deviation over 2 training seeds (1, 2)" in out.stdout
