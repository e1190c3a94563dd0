"""Warm start (FLOATER §3.3): a stock fairseq transformer, trained with fairseq-train, converted
by scripts/warm_start_floater.py, scores references exactly as the original; fine-tuning the
converted checkpoint with --restore-file --reset-optimizer trains FLOATER's dynamics."""

import os
import re
import sys

import pytest
import torch

from fairseq import checkpoint_utils

from helpers import PLUGIN, REPO, cli, synthetic_data_bin

SIZES = ["--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128", "--encoder-layers", "2",
         "--encoder-attention-heads", "4", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "128",
         "--decoder-layers", "2", "--decoder-attention-heads", "4", "--share-all-embeddings"]
TRAIN = ["--optimizer", "adam", "--lr", "0.005", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
         "--max-tokens", "1000", "--seed", "1", "--cpu", "--num-workers", "0", "--log-format", "simple",
         "--log-interval", "1", "--no-epoch-checkpoints", "--disable-validation",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]


def hypothesis_scores(stdout):
    """sentence id -> (full-precision H- score, rounded P- scores)."""
    h = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^H-(\d+)\t(\S+)\t", stdout, re.M)}
    p = {int(m.group(1)): [float(x) for x in m.group(2).split()] for m in re.finditer(r"^P-(\d+)\t(.*)$", stdout, re.M)}
    return h, p


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic_data_bin(tmp_path_factory.mktemp("warm"), train_size=600, valid_size=20,
                              test_buckets=[(1, 8), (9, 24)], test_per_bucket=10, seed=5)


def assert_same_reference_scores(data, original, converted):
    common = ["--gen-subset", "test", "--score-reference", "--batch-size", "7", "--cpu", "--num-workers", "0"]
    # --user-dir for a stock model too: only to apply the plugin's fixes for this torch
    # (weights_only checkpoint loading); the model it loads is fairseq's own transformer
    h_orig, p_orig = hypothesis_scores(cli("fairseq-generate", data, "--user-dir", PLUGIN, "--path", original,
                                           *common).stdout)
    h_conv, p_conv = hypothesis_scores(cli("fairseq-generate", data, "--user-dir", PLUGIN, "--path", converted,
                                           *common).stdout)
    assert sorted(h_orig) == sorted(h_conv) == list(range(20))
    for i in h_orig:
        assert abs(h_orig[i] - h_conv[i]) < 1e-4, (i, h_orig[i], h_conv[i])
        torch.testing.assert_close(torch.tensor(p_conv[i]), torch.tensor(p_orig[i]), rtol=0, atol=1.01e-4)


@pytest.mark.parametrize("arch,flags,absolute", [
    ("transformer", ["--encoder-learned-pos", "--decoder-learned-pos"], "learned"),
    ("transformer_pe", ["--pe-absolute", "learned", "--pe-relative", "t5"], "learned"),
    # a trained scale (issue 17) is carried over: the converted sinusoids are the trained ones
    ("transformer_pe", ["--pe-absolute", "learnable-sinusoidal", "--pe-sinusoid-scale", "0.5",
                        "--pe-sinusoid-scale-learnable"], "learnable-sinusoidal"),
], ids=["stock-learned-positions", "transformer_pe-learned+t5", "transformer_pe-scaled-learnable-sinusoids"])
def test_other_checkpoints_convert_exactly(tmp_path, data, arch, flags, absolute):
    save = str(tmp_path / "orig")
    cli("fairseq-train", data, "--user-dir", PLUGIN, "--arch", arch, *SIZES, *flags, *TRAIN, "--max-update", "15",
        "--save-dir", save)
    original = os.path.join(save, "checkpoint_last.pt")
    converted = str(tmp_path / "floater.pt")
    cli(sys.executable, os.path.join(REPO, "scripts", "warm_start_floater.py"), original, converted)
    args = checkpoint_utils.load_checkpoint_to_cpu(converted)["cfg"]["model"]
    assert args.pe_absolute == absolute and args.pe_floater_bias
    if "--pe-sinusoid-scale" in flags:
        scales = [checkpoint_utils.load_checkpoint_to_cpu(path)["model"]["encoder.embed_positions.absolute.sinusoid_scale"]
                  for path in (original, converted)]
        assert float(scales[0]) != 0.5 and torch.equal(*scales)  # it trained, and was copied
    assert_same_reference_scores(data, original, converted)


def test_floater_checkpoint_is_refused(tmp_path, data):
    save = str(tmp_path / "orig")
    cli("fairseq-train", data, "--user-dir", PLUGIN, "--arch", "transformer_pe_tiny", "--pe-floater-bias", *TRAIN,
        "--share-all-embeddings", "--max-update", "2", "--save-dir", save)
    run = cli(sys.executable, os.path.join(REPO, "scripts", "warm_start_floater.py"),
              os.path.join(save, "checkpoint_last.pt"), str(tmp_path / "x.pt"), check=False)
    assert run.returncode != 0 and "FLOATER model already" in run.stderr
    assert not os.path.exists(tmp_path / "x.pt")


def test_stock_transformer_converts_exactly_and_fine_tunes(tmp_path, data):
    stock_dir = str(tmp_path / "stock")
    cli("fairseq-train", data, "--arch", "transformer", *SIZES, *TRAIN, "--max-update", "30", "--save-dir", stock_dir)
    stock = os.path.join(stock_dir, "checkpoint_last.pt")

    floater = str(tmp_path / "floater_init.pt")
    conv = cli(sys.executable, os.path.join(REPO, "scripts", "warm_start_floater.py"), stock, floater)
    assert "Fine-tune with" in conv.stderr + conv.stdout

    # issue 14: the trained checkpoint is never the output, an existing output needs --force
    trained, converted = open(stock, "rb").read(), open(floater, "rb").read()
    for cmd in ([stock, stock], [stock, floater], [stock, stock, "--force"]):
        bad = cli("fairseq-pe-warm-start-floater", *cmd, check=False)
        errors = [line for line in bad.stderr.splitlines() if ": error: " in line]
        assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(errors) == 1, bad.stderr[-2000:]
        assert errors[0].startswith("fairseq-pe-warm-start-floater: error: OUTPUT")
    assert open(stock, "rb").read() == trained and open(floater, "rb").read() == converted
    cli("fairseq-pe-warm-start-floater", stock, floater, "--force")  # replaced (the same conversion again)
    assert sorted(os.listdir(tmp_path)) == ["floater_init.pt", "stock"]  # no temporary file left
    state = checkpoint_utils.load_checkpoint_to_cpu(floater)
    assert state["cfg"]["model"].arch == "transformer_pe"
    assert state["cfg"]["model"].pe_absolute == "sinusoidal-fairseq" and state["cfg"]["model"].pe_floater_bias
    assert "last_optimizer_state" not in state
    original = checkpoint_utils.load_checkpoint_to_cpu(stock)["model"]
    for key, value in original.items():  # every Transformer weight copied
        if not key.endswith("_float_tensor"):
            assert torch.equal(state["model"][key], value), key
    assert any(k.startswith("floater.dynamics") for k in state["model"])

    assert_same_reference_scores(data, stock, floater)

    tuned_dir = str(tmp_path / "tuned")
    tune = cli("fairseq-train", data, "--user-dir", PLUGIN, "--arch", "transformer_pe", *SIZES, *TRAIN,
               "--pe-absolute", "sinusoidal-fairseq", "--pe-floater-bias", "--restore-file", floater,
               "--reset-optimizer", "--max-update", "40", "--save-dir", tuned_dir)
    log = tune.stdout + tune.stderr
    assert "Loaded checkpoint" in log and "floater_init.pt" in log, log[-2000:]
    losses = [float(x) for x in re.findall(r"train_inner \|.* loss=([\d.]+),", log)]
    assert len(losses) >= 5 and len(set(losses)) > 1, log[-2000:]
    tuned = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(tuned_dir, "checkpoint_last.pt"))["model"]
    for key in ("floater.dynamics.w1", "floater.dynamics.w2", "encoder.embed_positions.self_bias.initial",
                "decoder.embed_positions.cross_bias.initial"):
        assert not torch.equal(tuned[key], state["model"][key]), f"{key} did not train"
    assert tuned["floater.dynamics.w2"].abs().sum() > 0  # h is no longer 0
