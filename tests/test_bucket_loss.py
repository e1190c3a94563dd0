"""fairseq-pe-bucket-loss: agrees with fairseq-validate and --score-reference, buckets and positions
right on hand-made sets, no sentence dropped (a learned table's overflow is an error or its own column)."""

import json
import math
import os
import re

import pytest

from fairseq_pe.translation import bucket_loss
from fairseq_pe.translation.bleu import parse_buckets
from fairseq_pe.translation.bucket_loss import BEYOND, SentenceLoss, aggregate, per_position, position_ranges
from fairseq_pe.outputs import train_sentencepiece

from helpers import PLUGIN, cli, exit_status, synthetic_data_bin

TRAIN = ["--optimizer", "adam", "--lr", "0.005", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
         "--max-tokens", "1000", "--max-update", "30", "--no-epoch-checkpoints", "--seed", "1", "--cpu",
         "--num-workers", "0", "--log-format", "simple", "--share-all-embeddings", "--criterion", "cross_entropy"]
N_TEST = 18


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A synthetic corpus (training sentences of 1-8 words, test up to 20) and two checkpoints:
    the plugin's learned APE with a 12-row source table, and fairseq's stock transformer."""
    root = tmp_path_factory.mktemp("loss")
    data = synthetic_data_bin(root, train_size=600, valid_size=30, train_lengths=(1, 8),
                              test_buckets=[(1, 8), (9, 14), (15, 20)], test_per_bucket=N_TEST // 3, seed=5)
    ckpts = {}
    for name, flags in {"learned": ["--user-dir", PLUGIN, "--arch", "transformer_pe_tiny", "--pe-absolute", "learned",
                                    "--max-source-positions", "12", "--max-target-positions", "40"],
                        "stock": ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
                                  "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
                                  "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"]}.items():
        save = str(root / name)
        cli("fairseq-train", data, *flags, *TRAIN, "--save-dir", save)
        ckpts[name] = os.path.join(save, "checkpoint_last.pt")
    return root, data, ckpts


def test_aggregate_buckets_and_positions_by_hand():
    losses = [SentenceLoss([1.0, 3.0]), SentenceLoss([2.0]), SentenceLoss([4.0, 4.0, 4.0]), SentenceLoss(None, "x")]
    out = aggregate(losses, [2, 5, 9, 9], parse_buckets("1,5,10"))
    assert out["[1,5)"] == {"nll": 2.0, "ppl": 4.0, "tokens": 2, "n": 1, "scored": 1}
    assert out["[5,10)"]["nll"] == pytest.approx(14 / 4) and out["[5,10)"]["tokens"] == 4
    assert out["[5,10)"]["n"] == 3 and out["[5,10)"]["scored"] == 2 and out["[5,10)"]["beyond"] == 1
    assert out["all"]["nll"] == pytest.approx(18 / 6) and out["all"]["n"] == 4
    assert out[BEYOND] == {"n": 1}
    curve = per_position(losses)
    assert curve == [{"position": 1, "nll": pytest.approx(7 / 3), "n": 3},
                     {"position": 2, "nll": 3.5, "n": 2}, {"position": 3, "nll": 4.0, "n": 1}]
    ranges = position_ranges(curve, parse_buckets("1,2+"))
    assert ranges["[1,2)"]["nll"] == pytest.approx(7 / 3) and ranges["[2,inf)"]["nll"] == pytest.approx(11 / 3)
    with pytest.raises(Exception, match="in none of the --buckets"):
        aggregate(losses, [2, 5, 9, 11], parse_buckets("1,5,10"))


def _valid_loss(out: str) -> float:
    return float(re.search(r"valid on 'valid' subset \| loss ([\d.]+)", out).group(1))


def test_agrees_with_fairseq_validate_and_score_reference(trained, tmp_path):
    root, data, ckpts = trained
    for name in ("learned", "stock"):
        # (--user-dir for the stock model too: stock fairseq cannot load checkpoints on this torch, compat/)
        val = cli("fairseq-validate", data, "--user-dir", PLUGIN, "--task", "translation", "--path", ckpts[name], "--cpu",
                  "--num-workers", "0", "--max-tokens", "500")
        res = bucket_loss.evaluate({name: ckpts[name]}, data, subset="valid", buckets=parse_buckets("0+"))
        assert res[name]["buckets"]["all"]["nll"] == pytest.approx(_valid_loss(val.stdout + val.stderr), abs=6e-4)
        assert res[name]["buckets"]["all"]["n"] == 30
    # per sentence: fairseq-generate --score-reference's positional scores (base 2) on the test set
    ref = cli("fairseq-generate", data, "--user-dir", PLUGIN, "--path", ckpts["stock"], "--gen-subset", "test", "--score-reference",
              "--batch-size", "5", "--cpu", "--num-workers", "0")
    printed = {}
    for line in ref.stdout.splitlines():
        if line.startswith("P-"):
            idx, vals = line[2:].split("\t", 1)
            printed[int(idx)] = [-float(v) for v in vals.split()]
    model, task = bucket_loss.load_system("stock", ckpts["stock"], data, {}, cpu=True)
    dataset, train_length = bucket_loss.binary_test_set(task, "test", data)
    losses = bucket_loss.score_references(model, task, dataset, 300, "error", "stock")
    assert sorted(printed) == list(range(N_TEST)) and len(losses) == N_TEST
    for i, loss in enumerate(losses):
        assert loss.nll == pytest.approx(printed[i], abs=1.5e-4)  # printed to 4 decimals
    # the longest training target: 8 words (+ </s>) at most
    assert 2 <= train_length <= 9


def test_cli_learned_table_overflow_is_an_error_or_its_own_column(trained, tmp_path, capsys):
    root, data, ckpts = trained
    systems = ["--system", f"learned={ckpts['learned']}", "--system", f"stock={ckpts['stock']}"]
    source = str(root / "raw" / "test.src")
    assert exit_status(bucket_loss.main, [data, *systems, "--source", source, "--reference",
                                          str(root / "raw" / "test.tgt"), "--buckets", "1,9,15,21"]) == 2
    assert "--spm-model" in capsys.readouterr().err
    assert exit_status(bucket_loss.main, [data, *systems, "--unit", "token", "--buckets", "1,9,15,21",
                                          "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--max-source-positions" in err and "--beyond-table report" in err and "learned" in err
    out = str(tmp_path / "loss")
    assert exit_status(bucket_loss.main, [data, *systems, "--unit", "token", "--buckets", "1,9,15,21",
                                          "--beyond-table", "report", "--out", out, "--quiet"]) in (None, 0)
    printed = capsys.readouterr().out
    assert BEYOND in printed
    res = json.load(open(out + ".json"))
    learned, stock = res["systems"]["learned"]["buckets"], res["systems"]["stock"]["buckets"]
    # every sentence is counted: scored + beyond = n, per bucket and overall
    assert learned["all"]["n"] == stock["all"]["n"] == N_TEST
    assert learned[BEYOND]["n"] > 0 and stock[BEYOND]["n"] == 0
    assert learned["all"]["scored"] + learned[BEYOND]["n"] == N_TEST
    assert learned["[1,9)"].get("beyond", 0) == 0  # short sources fit the 12-row table (11 words + </s>)
    assert sum(b.get("beyond", 0) for k, b in learned.items() if k.startswith("[")) == learned[BEYOND]["n"]
    assert res["systems"]["stock"]["train_length"] == res["systems"]["learned"]["train_length"]
    assert os.path.getsize(out + ".png") > 1000
    # the outputs are never replaced without --force
    assert exit_status(bucket_loss.main, [data, *systems, "--unit", "token", "--out", out, "--quiet"]) == 2
    assert "--force" in capsys.readouterr().err


def test_the_console_script_scores_beyond_the_table_or_refuses(trained, tmp_path):
    """The installed fairseq-pe-bucket-loss (a new interpreter in tests/fresh_subset.py): a learned table too short for
    the longest sources is one line naming the flags, status 2; with --beyond-table report every sentence is counted."""
    root, data, ckpts = trained
    systems = ["--system", f"learned={ckpts['learned']}", "--system", f"stock={ckpts['stock']}"]
    bad = cli("fairseq-pe-bucket-loss", data, *systems, "--unit", "token", "--buckets", "1,9,15,21", "--quiet",
              check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-3000:]
    assert bad.stderr.strip().splitlines()[-1].startswith("fairseq-pe-bucket-loss: error: ")
    assert "--max-source-positions" in bad.stderr and "--beyond-table report" in bad.stderr
    out = str(tmp_path / "loss")
    cli("fairseq-pe-bucket-loss", data, *systems, "--unit", "token", "--buckets", "1,9,15,21", "--beyond-table",
        "report", "--out", out, "--quiet")
    res = json.load(open(out + ".json"))
    learned = res["systems"]["learned"]["buckets"]
    assert learned["all"]["n"] == res["systems"]["stock"]["buckets"]["all"]["n"] == N_TEST
    assert learned[BEYOND]["n"] > 0 and learned["all"]["scored"] + learned[BEYOND]["n"] == N_TEST


def test_raw_text_with_sentencepiece_scores_every_line(trained, tmp_path, capsys):
    root, data, ckpts = trained
    raw = root / "raw"
    # the plumbing of raw text: segmented by --spm-model, mapped by DATA's dictionaries, every line scored
    spm = train_sentencepiece(str(tmp_path / "spm"), input=[str(raw / "train.src"), str(raw / "train.tgt")],
                              vocab_size=60, model_type="word", hard_vocab_limit=False, minloglevel=2)
    assert exit_status(bucket_loss.main, [data, "--system", f"stock={ckpts['stock']}", "--source",
                                          str(raw / "test.src"), "--reference", str(raw / "test.tgt"),
                                          "--spm-model", spm, "--buckets", "1,9,15,21", "--quiet",
                                          "--out", str(tmp_path / "r")]) in (None, 0)
    res = json.load(open(tmp_path / "r.json"))
    assert res["length_unit"] == "words"
    assert [res["systems"]["stock"]["buckets"][b]["n"] for b in res["buckets"]] == [6, 6, 6]
    assert all(math.isfinite(res["systems"]["stock"]["buckets"][b]["nll"]) for b in res["buckets"])


def test_bad_input_names_the_flag(trained, tmp_path, capsys):
    root, data, ckpts = trained
    cases = [
        ([data, "--system", f"x={tmp_path / 'missing.pt'}"], "--system x="),
        ([data, "--system", "nopath"], "use NAME=CHECKPOINT"),
        ([str(tmp_path / "nodata"), "--system", f"s={ckpts['stock']}"], "DATA"),
        ([data, "--system", f"s={ckpts['stock']}", "--model-overrides", "[1]"], "--model-overrides"),
        ([data, "--system", f"s={ckpts['stock']}", "--gen-subset", "nosuch"], "--gen-subset nosuch"),
        ([data, "--system", f"s={ckpts['stock']}", "--unit", "word"], "--unit word"),
        ([data, "--system", f"s={ckpts['stock']}", "--source", str(root / "raw" / "test.src")], "--reference"),
        ([data, "--system", f"s={ckpts['stock']}", "--buckets", "1,3"], "in none of the --buckets"),
    ]
    for argv, fragment in cases:
        assert exit_status(bucket_loss.main, argv + ["--quiet"]) == 2, argv
        err = capsys.readouterr().err
        assert "fairseq-pe-bucket-loss: error:" in err and fragment in err, (argv, err)
        assert "Traceback" not in err
