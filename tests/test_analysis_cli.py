"""fairseq-pe-analyze end to end on checkpoints trained with fairseq-train, and checkpoint loading.

A transformer_pe with learnable-sinusoidal APE and RPE (absolute and relative vectors, learned
frequencies of both) and a stock fairseq transformer are trained for a few updates; one call of the
command analyses both and must write every file, with scores that agree with the Python API and with
what the encodings guarantee after training.
"""

import argparse
import json
import os
import re

import numpy as np
import pytest
import torch

from fairseq_pe.analysis import AnalysisError, AnalysisOptions, analyze, load_checkpoint
from fairseq_pe.analysis.checkpoint import CheckpointError, save_untrained_checkpoint
from fairseq_pe.analysis.properties import proximity
from fairseq_pe.positional.sinusoidal import transformer_frequencies
from fairseq_pe.translation.synthetic import write_corpus

from helpers import PLUGIN, analyze_in_process, assert_pictures_and_reports, cli

TRAIN = ["--optimizer", "adam", "--lr", "0.01", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5",
         "--max-tokens", "1000", "--max-update", "25", "--no-epoch-checkpoints",
         "--seed", "1", "--cpu", "--num-workers", "0", "--log-format", "simple", "--share-all-embeddings",
         "--criterion", "cross_entropy", "--disable-validation"]
STOCK_SIZES = ["--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
               "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
               "--decoder-attention-heads", "2", "--encoder-learned-pos", "--max-source-positions", "90"]
PER_CHECKPOINT = {"report.md", "scores.json", "matrices.npz", "absolute.png", "identical-word.png", "profiles.png",
                  "probe.png", "norms.png"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("analysis")
    raw = write_corpus(str(root / "raw"), train_size=600, valid_size=20, test_buckets=[(1, 8)], test_per_bucket=5,
                       seed=5)
    data = str(root / "bin")
    cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train",
        "--validpref", f"{raw}/valid", "--destdir", data, "--joined-dictionary", "--workers", "1")
    pe = str(root / "lsin")
    cli("fairseq-train", data, "--user-dir", PLUGIN, "--arch", "transformer_pe_tiny", *TRAIN, "--save-dir", pe,
        "--pe-absolute", "learnable-sinusoidal", "--pe-relative", "learnable-sinusoidal")
    stock = str(root / "stock")
    cli("fairseq-train", data, "--user-dir", PLUGIN, "--arch", "transformer", *STOCK_SIZES, *TRAIN, "--save-dir", stock)
    return {"lsin": os.path.join(pe, "checkpoint_last.pt"), "stock": os.path.join(stock, "checkpoint_last.pt"),
            "data": data}


def test_command_writes_every_file(checkpoints, tmp_path):
    out = tmp_path / "out"
    proc = cli("fairseq-pe-analyze", checkpoints["lsin"], checkpoints["stock"], "--out", str(out),
               "--length", "48", "--probe-length", "80", "--num-tokens", "20", "--trained-length", "20")
    # one table of both, on stdout and in properties.md
    table = (out / "properties.md").read_text()
    assert table in proc.stdout
    assert "[1/2] lsin: loading" in proc.stderr and "[2/2] stock: loaded, analysed and written" in proc.stderr
    assert re.search(r"^\| lsin \| --pe-absolute learnable-sinusoidal --pe-relative learnable-sinusoidal \|", table, re.M)
    assert re.search(r"^\| stock \| learned APE \(stock fairseq\) \|", table, re.M)
    assert {p.name for p in out.iterdir()} == {"lsin", "stock", "properties.md", "properties.json", "report.md",
                                              "identical-word.png", "absolute.png", "norms.png"}
    assert {p.name for p in (out / "lsin").iterdir()} == PER_CHECKPOINT | {"relative.png", "frequencies.png"}
    assert {p.name for p in (out / "stock").iterdir()} == PER_CHECKPOINT
    assert_pictures_and_reports(out)
    summary = {r["name"]: r for r in json.loads((out / "properties.json").read_text())}
    assert set(summary) == {"lsin", "stock"}

    s = json.loads((out / "lsin" / "scores.json").read_text())
    assert s["length"] == 48 and s["probe_length"] == 80 and s["num_tokens"] == 20
    # trained sinusoids, absolute and relative, are still exactly translation invariant (ψ(x − y))
    assert s["absolute"]["1"]["dot"]["translation_invariance"] < 1e-5
    assert s["relative"]["same_key_value"] and s["relative"]["max_distance"] == 64
    assert s["relative"]["blocks"]["1"]["key"]["translation_invariance"] < 1e-5
    assert s["absolute"]["1"]["probe"]["exact_share"] == 1.0  # sinusoids: position recovered exactly
    assert [f["name"] for f in s["frequencies"]] == ["absolute", "relative"]
    learned = torch.tensor(s["frequencies"][0]["learned"], dtype=torch.float64)
    assert torch.equal(torch.tensor(s["frequencies"][0]["initial"]), transformer_frequencies(64).double())
    assert not torch.allclose(learned, transformer_frequencies(64).double())  # 25 updates moved them
    assert len(s["identical_word"]["heads"]) == 4
    # norms against position (norms.png): every sinusoid [sin ωp; cos ωp] has norm √(D/2), whatever ω
    assert len(s["absolute"]["1"]["norms"]) == 48 and s["trained_length"] == 20
    np.testing.assert_allclose(s["absolute"]["1"]["norms"], [32 ** 0.5] * 48, rtol=1e-5)
    mean_logits = np.load(out / "lsin" / "matrices.npz")["identical_word_mean"]
    by_hand = [np.abs(mean_logits[:i + 1, :i + 1]).max() for i in range(48)]  # positions 0..i
    np.testing.assert_allclose(s["identical_word"]["max_abs_up_to"], by_hand, rtol=1e-5)
    assert summary["lsin"]["identical_word.symmetry"] == s["identical_word"]["mean"]["symmetry"]

    stock = json.loads((out / "stock" / "scores.json").read_text())
    assert stock["position_limit"] == 90 and stock["relative"] is None and stock["frequencies"] == []
    # the data folder is still there: its dictionary, without fairseq-preprocess's madeupword padding
    assert stock["dictionary"] == f"{checkpoints['data']}/dict.src.txt, {checkpoints['data']}/dict.tgt.txt"
    assert stock["absolute"]["1"]["dot"]["translation_invariance"] > 0.3  # a learned table is not

    # the saved matrices are those of the Python API on the same checkpoint
    loaded = load_checkpoint(checkpoints["stock"])
    padding = [i for i in range(len(loaded.dictionary)) if loaded.dictionary[i].startswith("madeupword")]
    assert padding and set(padding) <= set(loaded.non_words())
    again = analyze(loaded, "stock", AnalysisOptions(length=48, probe_length=80, num_tokens=20))
    with np.load(out / "stock" / "matrices.npz") as saved:
        assert set(saved.files) == {"absolute_dot_block1", "absolute_cosine_block1", "identical_word_heads",
                                    "identical_word_mean"}
        for key, value in again.matrices.items():
            np.testing.assert_allclose(saved[key], value.numpy(), rtol=1e-12, atol=1e-12)
    # and the stock table's rows (fairseq offsets them by padding_idx + 1) are the vectors analysed
    table = loaded.model.encoder.embed_positions.weight.detach().double()
    pad = loaded.model.encoder.padding_idx
    torch.testing.assert_close(again.matrices["absolute_dot_block1"], proximity(table[pad + 1:pad + 49]))


def test_decoder_side(checkpoints, tmp_path):
    out = tmp_path / "dec"
    quiet = cli("fairseq-pe-analyze", checkpoints["lsin"], "--side", "decoder", "--out", str(out), "--length", "24",
                "--probe-length", "24", "--num-tokens", "10", "--quiet")
    assert "loading" not in quiet.stderr and "| lsin |" in quiet.stdout
    s = json.loads((out / "lsin" / "scores.json").read_text())
    assert s["side"] == "decoder" and s["layers"] == 2
    # a decoder looks back only: no rightward window, no symmetry; its relative vectors are -K..0
    iw = s["identical_word"]["mean"]
    assert iw["window_right"] is None and iw["symmetry"] is None and iw["window_left"] is not None
    assert iw["translation_invariance"] >= 0 and 0 <= iw["eq2_share"] <= 1
    assert s["relative"]["distances"] == [-64, 0]
    with np.load(out / "lsin" / "matrices.npz") as saved:
        logits = saved["identical_word_mean"]
        assert np.isnan(logits[np.triu_indices(24, 1)]).all() and not np.isnan(logits[np.tril_indices(24)]).any()
        assert saved["relative_key_dot_block1"].shape == (65, 65)
    assert "(decoder)" in (out / "properties.md").read_text()
    loaded = load_checkpoint(checkpoints["lsin"])
    again = analyze(loaded, "lsin", AnalysisOptions(length=24, probe_length=24, num_tokens=10, side="decoder"))
    with np.load(out / "lsin" / "matrices.npz") as saved:
        for key, value in again.matrices.items():
            np.testing.assert_allclose(saved[key], value.numpy(), rtol=1e-12, atol=1e-12)
    encoder_side = analyze(loaded, "lsin", AnalysisOptions(length=24, probe_length=24, num_tokens=10))
    assert not np.allclose(np.nan_to_num(encoder_side.matrices["identical_word_mean"].numpy()),
                           np.nan_to_num(again.matrices["identical_word_mean"].numpy()))

    # a stock decoder: fairseq's own sinusoids (the encoder has a learned table), offset by padding_idx + 1
    from fairseq.modules import SinusoidalPositionalEmbedding

    stock = load_checkpoint(checkpoints["stock"])
    assert stock.encoding("encoder") == "learned APE (stock fairseq)"
    assert stock.encoding("decoder") == "sinusoidal APE (stock fairseq)"
    dec = analyze(stock, "stock", AnalysisOptions(length=24, probe_length=24, num_tokens=10, side="decoder"))
    pad = stock.model.decoder.padding_idx
    table = SinusoidalPositionalEmbedding.get_embedding(pad + 1 + 24, 32, pad)[pad + 1:].double()
    torch.testing.assert_close(dec.matrices["absolute_dot_block1"], proximity(table))
    # ψ window of fairseq's frequencies (10000^(-i/(D/2-1))), read off the table itself
    psi = (table[:1] @ table[:200].t())[0]
    window = next(m for m in range(200) if psi[m + 1] >= psi[m])
    assert dec.scores["fixed_psi_window"] == {"absolute": window}


def test_command_refuses_bad_input(checkpoints, tmp_path):
    bad = cli("fairseq-pe-analyze", checkpoints["stock"], "--out", str(tmp_path / "o"), "--length", "200", check=False)
    assert bad.returncode == 2 and "--length 200" in bad.stderr and "90 positions" in bad.stderr
    bad = cli("fairseq-pe-analyze", checkpoints["stock"], checkpoints["lsin"], "--names", "a", "--out",
              str(tmp_path / "o"), check=False)
    assert bad.returncode == 2 and "--names gives 1 names for 2 checkpoints" in bad.stderr
    missing = str(tmp_path / "nope.pt")
    bad = cli("fairseq-pe-analyze", missing, "--out", str(tmp_path / "o"), check=False)
    assert bad.returncode == 2 and f"{missing}: no such file" in bad.stderr
    not_a_checkpoint = tmp_path / "junk.pt"
    not_a_checkpoint.write_text("hello")
    bad = cli("fairseq-pe-analyze", str(not_a_checkpoint), "--out", str(tmp_path / "o"), check=False)
    assert bad.returncode == 2 and "cannot be read as a fairseq checkpoint" in bad.stderr
    bad = cli("fairseq-pe-analyze", checkpoints["stock"], "--num-tokens", "100000", "--out", str(tmp_path / "o"),
              check=False)
    assert bad.returncode == 2 and "--num-tokens 100000" in bad.stderr
    # an option that one of several checkpoints cannot take fails before anything is analysed
    out = tmp_path / "several"
    bad = cli("fairseq-pe-analyze", checkpoints["lsin"], checkpoints["stock"], "--length", "120", "--out", str(out),
              check=False)
    assert bad.returncode == 2 and f"{checkpoints['stock']}: --length 120" in bad.stderr and not out.exists()


def test_roberta_checkpoints_stock_and_floater(tmp_path):
    stock = str(tmp_path / "roberta.pt")
    save_untrained_checkpoint(stock, "roberta", ["--encoder-layers", "2", "--encoder-embed-dim", "32",
                                                 "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2"],
                              vocab=60, max_positions=70, task={"_name": "masked_lm", "tokens_per_sample": 40})
    loaded = load_checkpoint(stock)
    assert loaded.family == "roberta" and loaded.description == "learned APE (stock fairseq)"
    # rows beyond the 40 trained positions keep their initialisation: the defaults stop there
    a = analyze(loaded, "roberta")
    assert loaded.trained_length == 40 and a.scores["length"] == 40 and a.scores["probe_length"] == 40
    assert a.scores["num_tokens"] == 55 and loaded.non_words() == [0, 1, 2, 3, 59]  # specials and <mask>
    assert analyze(loaded, "roberta", AnalysisOptions(length=70)).scores["length"] == 70  # asked for: allowed
    floater = str(tmp_path / "floater.pt")
    built = save_untrained_checkpoint(floater, "roberta_pe_tiny", ["--pe-absolute", "floater", "--pe-all-blocks"],
                                      vocab=60)
    a = analyze(load_checkpoint(floater), "floater", AnalysisOptions(length=20, probe_length=20))
    assert sorted(a.scores["absolute"], key=int) == ["1", "2", "3", "4"]  # one set of vectors per block
    # the vectors analysed are those the model adds at block 3
    flow = built.floater
    with torch.no_grad(), flow.forward_pass(20):
        expected = built.encoder.sentence_encoder.embed_positions.absolute(20, 3).double()
    torch.testing.assert_close(a.matrices["absolute_dot_block3"], proximity(expected))
    with pytest.raises(AnalysisError, match="--side decoder: .*roberta.pt is a roberta model, which has no decoder"):
        analyze(load_checkpoint(stock), "roberta", AnalysisOptions(side="decoder"))
    lm = str(tmp_path / "lm.pt")  # a decoder-only language model: no encoder to analyse
    torch.save({"cfg": {"model": argparse.Namespace(arch="transformer_lm")}, "extra_state": {},
                "model": {"decoder.embed_tokens.weight": torch.zeros(30, 16)},
                "optimizer_history": [{"criterion_name": "cross_entropy", "optimizer_name": "adam",
                                       "lr_scheduler_state": {"best": None}, "num_updates": 0}]}, lm)
    with pytest.raises(CheckpointError, match="lm.pt: neither a translation model .* nor a RoBERTa model"):
        load_checkpoint(lm)


def test_out_is_replaced_only_with_force_and_never_over_a_checkpoint(tmp_path, capsys):
    """Issue 14: a second analysis into the same --out needs --force (then pictures this analysis does
    not draw are removed); no output may be a checkpoint analysed; every error is one line."""
    def main(*argv):
        return analyze_in_process(capsys, *argv)

    ape, rpe = tmp_path / "ape" / "model.pt", tmp_path / "rpe" / "model.pt"
    for path, flags in ((ape, ["--pe-absolute", "learned"]), (rpe, ["--pe-absolute", "none", "--pe-relative", "learned"])):
        path.parent.mkdir()
        save_untrained_checkpoint(str(path), "roberta_pe_tiny", flags, vocab=40, max_positions=32)
    out = tmp_path / "out"
    opts = ["--length", "8", "--probe-length", "8", "--num-tokens", "5", "--quiet", "--names", "m"]
    assert main(ape, "--out", out, *opts) == (0, "")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {"absolute.png", "probe.png"} <= {p.name for p in (out / "m").iterdir()}
    code, err = main(rpe, "--out", out, *opts)
    assert code == 2 and f"--out {out}: " in err and "exist already" in err and "pass --force" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing touched
    assert main(rpe, "--out", out, *opts, "--force") == (0, "")
    files = {p.name for p in (out / "m").iterdir()}
    assert "relative.png" in files and not {"absolute.png", "probe.png"} & files  # the earlier run's are gone
    assert not (out / "absolute.png").exists() and not any(p.name.startswith(".") for p in out.rglob("*"))
    # a checkpoint where an output would go (a file named like one): refused, --force or not
    odd = tmp_path / "odd" / "scores.json"
    odd.parent.mkdir()
    odd.write_bytes(ape.read_bytes())
    code, err = main(odd, "--out", tmp_path, "--names", "odd", "--force")
    assert code == 2 and f"would write over the input CHECKPOINT {odd}" in err
    assert odd.read_bytes() == ape.read_bytes()
    code, err = main(tmp_path / "nope.pt", "--out", out, "--force")
    assert code == 2 and f"error: {tmp_path / 'nope.pt'}: no such file" in err


def test_largest_logit_up_to_each_position_by_hand():
    from fairseq_pe.analysis.report import max_abs_up_to

    m = torch.tensor([[1.0, -5.0, 2.0], [0.0, 3.0, float("nan")], [7.0, 0.0, 1.0]])
    assert max_abs_up_to(m) == [1.0, 5.0, 7.0]  # the squares [0..i] x [0..i]; NaN (a decoder's future) skipped


def test_largest_norm_over_blocks_and_floater_biases_by_hand():
    from fairseq_pe.analysis.report import largest_norms

    scores = {"absolute": {"1": {"norms": [1.0, 5.0, 2.0]}, "2": {"norms": [3.0, 1.0, 1.0]}},
              "floater_bias": {"1": {"q": [0.0, 0.0, 7.0], "k": [0.5, 0.5, 0.5], "v": [2.5, 0.0, 0.0]}}}
    assert largest_norms(scores) == [3.0, 5.0, 7.0]
    assert largest_norms({"absolute": None, "floater_bias": None}) == []


@pytest.mark.parametrize("name,symmetric", [("kerple-log", True), ("kerple-power", True), ("sandwich", True),
                                            ("fire", False), ("xpos", False)])
def test_extrapolation_encodings_are_analysed(tmp_path, name, symmetric):
    """Issue 18's encodings in the identical-word probe: functions of i − j only (translation invariant), symmetric
    where their bias is even in i − j (KERPLE, Sandwich), not where it is signed (FIRE's encoder form) or rotary."""
    path = str(tmp_path / f"{name}.pt")
    save_untrained_checkpoint(path, "transformer_pe_tiny", ["--pe-absolute", "none", "--pe-relative", name], vocab=60)
    a = analyze(load_checkpoint(path), name, AnalysisOptions(length=20, probe_length=20))
    scores = a.scores["identical_word"]["mean"]
    assert np.isfinite(a.matrices["identical_word_mean"].numpy()).all()
    assert scores["translation_invariance"] < 1e-6 and not scores["constant"]
    assert (scores["symmetry"] < 1e-6) if symmetric else (scores["symmetry"] > 1e-2)
