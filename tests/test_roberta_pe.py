"""``roberta_pe``: every encoding in fairseq's RoBERTa, initialisation, padding, the 128 -> 512
continuation of the learned table, span-head upgrades, the pretraining data preparation and the
warm start from a stock RoBERTa checkpoint (exact with FLOATER's dynamics at zero)."""

import argparse
import os
from types import SimpleNamespace

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY

from helpers import FIXTURES, PLUGIN, cli

from fairseq_pe import systems as catalogue
from fairseq_pe.models.options import position_encoding_defaults
from fairseq_pe.models.roberta_pe import LEARNED_TABLE_KEY, RobertaPEModel
from fairseq_pe.positional.sinusoid_scale import ROBERTA_DEFAULTS
from fairseq_pe.positional.sinusoidal import transformer_frequencies

#: BERT's learned APE (roberta_pe's default), the catalogue's group "roberta" (FIRE's threshold at 4: the test's
#: sentences go past it), DAPE v2 (its convolutions along the keys reach right padding), randomised positions with
#: two encodings, FLOATER's biases on the learned APE
ENCODINGS = [
    [],
    *(catalogue.flags(name) + (["--pe-fire-threshold", "4"] if name == "fire" else [])
      for name in catalogue.GROUPS["roberta"]),
    catalogue.flags("alibi-dape2"),
    ["--pe-absolute", "learned", "--pe-relative", "alibi", "--pe-random-positions", "64"],
    ["--pe-floater-bias"],
]


def test_floater_bound_follows_each_models_token_scale():
    """roberta_pe's FLOATER bound is 0.02 (its tokens are 50x smaller per coordinate than transformer_pe's,
    whose bound is 1): its positions move at most 0.02·Δt per coordinate and position; a flag still wins."""
    model, _ = build("--pe-absolute", "floater", max_positions=256)
    assert model.floater.bound == 0.02 and model.floater.dynamics.bound == 0.02
    with torch.no_grad():
        p = model.encoder.position_injector.absolute(256).float().reshape(256, -1)
    drift = (p - p[0]).abs().max(dim=1).values
    steps = torch.arange(256, dtype=torch.float32) * 0.02 * model.floater.dt
    assert bool((drift <= steps + 1e-6).all()) and float(drift[-1]) > 0.5 * float(steps[-1])
    assert build("--pe-floater-bias")[0].floater.bound == 0.1
    assert build("--pe-absolute", "floater", "--pe-floater-bound", "1")[0].floater.bound == 1.0
    transformer_args = argparse.Namespace(pe_absolute="floater")
    position_encoding_defaults(transformer_args)
    assert transformer_args.pe_floater_bound == 1.0


def dictionary(vocab=40):
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}")
    d.add_symbol("<mask>")
    return d


def build(*flags, max_positions=64, seed=0, d=None):
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    RobertaPEModel.add_args(parser)
    args = parser.parse_args(list(flags) + ["--max-positions", str(max_positions)])
    ARCH_CONFIG_REGISTRY["roberta_pe_tiny"](args)
    d = d or dictionary()
    torch.manual_seed(seed)
    model = RobertaPEModel.build_model(args, SimpleNamespace(source_dictionary=d))
    return model.eval(), d


def batch(d, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), max(lengths)), d.pad())
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.randint(d.nspecial, len(d) - 1, (n,), generator=g)
        tokens[row, 0] = d.bos()
        tokens[row, n - 1] = d.eos()
    return tokens


@pytest.mark.parametrize("flags", ENCODINGS, ids=lambda f: " ".join(f) or "learned")
def test_padding_does_not_change_outputs(flags):
    """Right padding (masked_lm / sentence_prediction batches): each row's outputs equal its
    unpadded run, so positions count real tokens only and padding never leaks into attention."""
    model, d = build(*flags)
    tokens = batch(d, [23, 9, 16])
    with torch.no_grad():
        padded, _ = model(tokens)
        for row, n in enumerate([23, 9, 16]):
            alone, _ = model(tokens[row:row + 1, :n])
            torch.testing.assert_close(padded[row, :n], alone[0], rtol=1e-4, atol=1e-4)


def test_bert_initialisation_keeps_each_encodings_own():
    """init_bert_params re-initialises Linear/Embedding/attention; the encodings keep theirs."""
    model, _ = build("--pe-absolute", "learnable-sinusoidal")
    absolute = model.encoder.position_injector.absolute
    torch.testing.assert_close(absolute.omega.detach(), transformer_frequencies(128))
    model, _ = build("--pe-absolute", "none", "--pe-relative", "learned")
    rel = model.encoder.position_injector.relative
    head_dim = 128 // 4
    assert abs(float(rel.key_vectors.std()) - head_dim ** -0.5) < 0.03  # its own N(0, 1/d), not BERT's 0.02
    # the attention projections did get BERT's N(0, 0.02)
    q = model.encoder.sentence_encoder.layers[0].self_attn.q_proj.weight
    assert abs(float(q.std()) - 0.02) < 0.003
    model, _ = build()
    table = model.encoder.position_injector.absolute.weight
    assert table.shape == (1, 64, 128) and abs(float(table.std()) - 0.02) < 0.003  # BERT's learned positions
    model, _ = build("--pe-absolute", "floater", "--pe-all-blocks")
    w1 = model.floater.dynamics.w1
    xavier = (2.0 / (w1.size(1) + w1.size(2))) ** 0.5  # the official code's Xavier-normal, not BERT's N(0, 0.02)
    assert abs(float(w1.std()) - xavier) < 0.1 * xavier and float(model.floater.dynamics.b1.abs().max()) == 0


def test_learned_table_continues_at_a_longer_length_and_is_never_cut():
    short, _ = build(max_positions=16)
    state = short.state_dict()
    long, _ = build(max_positions=40, seed=1)
    before = long.encoder.position_injector.absolute.weight.detach().clone()
    long.load_state_dict(dict(state))
    table = long.encoder.position_injector.absolute.weight.detach()
    torch.testing.assert_close(table[:, :16], state[LEARNED_TABLE_KEY])
    torch.testing.assert_close(table[:, 16:], before[:, 16:])  # new rows: the model's own initialisation
    tiny, _ = build(max_positions=8)
    with pytest.raises(ValueError, match="--max-positions 16"):
        tiny.load_state_dict(dict(state))


def test_longer_input_than_the_learned_table_is_an_error_naming_the_flag():
    model, d = build(max_positions=16)
    with pytest.raises(ValueError, match="--max-positions"):
        model(batch(d, [20]))


def test_span_heads_are_added_to_checkpoints_that_lack_them():
    plain, _ = build()
    state = plain.state_dict()
    model, _ = build(seed=3)
    model.register_span_head("span_head")
    head = {k: v.clone() for k, v in model.span_heads.state_dict().items()}
    model.load_state_dict(dict(state))
    for k, v in model.span_heads.state_dict().items():
        torch.testing.assert_close(v, head[k])
    torch.testing.assert_close(model.encoder.sentence_encoder.embed_tokens.weight,
                               state["encoder.sentence_encoder.embed_tokens.weight"])


# --------------------------------------------------------------------------------------------
# through the CLIs: data preparation, pretraining, continuing at a longer length, warm start


@pytest.fixture(scope="module")
def mono(tmp_path_factory):
    """The first chapter of Austen's *Persuasion* (tests/fixtures, from ../shared/data/mono/en), prepared
    by fairseq-pe-prepare-mono."""
    root = tmp_path_factory.mktemp("mono")
    with open(os.path.join(FIXTURES, "persuasion-chapter1.txt"), encoding="utf-8") as f:
        lines = f.readlines()
    text = root / "persuasion.txt"
    text.write_text("".join(lines), encoding="utf-8")
    # 30 %: 48 of its 236 lines, 46 valid blocks of 32 tokens; stock fairseq drops a last batch smaller
    # than --required-batch-size-multiple (8), so it needs 8 of them to validate at all
    out = cli("fairseq-pe-prepare-mono", "--input", str(text), "--destdir", str(root / "bin"),
              "--vocab-size", "300", "--valid-percent", "30", "--workers", "1")
    non_empty = sum(1 for line in lines if line.strip())
    counts = {}
    for split in ("train", "valid"):
        with open(root / "bin" / "raw" / f"{split}.txt", encoding="utf-8") as f:
            counts[split] = sum(1 for line in f if line.strip())
    assert counts["train"] + counts["valid"] == non_empty and counts["valid"] > 0  # no line lost
    assert "dictionary of 299 pieces" in out.stdout
    return root / "bin"


def pretrain(data, save_dir, *flags, arch="roberta_pe_tiny", updates=3, tokens=32, max_positions=None,
             user_dir=True):
    cmd = ["fairseq-train", str(data), "--task", "masked_lm", "--criterion", "masked_lm", "--arch", arch,
           "--tokens-per-sample", str(tokens), "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8",
           "--max-update", str(updates), "--cpu", "--num-workers", "0", "--save-dir", str(save_dir),
           "--no-epoch-checkpoints", "--log-format", "simple", "--seed", "1",
           "--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
           "--encoder-attention-heads", "2"]
    if max_positions:
        cmd += ["--max-positions", str(max_positions)]
    if user_dir:
        cmd += ["--user-dir", PLUGIN]
    return cli(*cmd, *flags)


def load_state(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def test_pretraining_at_128_then_512_continues_the_learned_table(mono, tmp_path):
    """BERT's schedule, scaled down (16 then 40 tokens): the second phase restores the first's
    checkpoint, its shorter table grows, and the trained rows carry over."""
    pretrain(mono, tmp_path / "p1", tokens=16, max_positions=16)
    first = load_state(tmp_path / "p1" / "checkpoint_last.pt")["model"][LEARNED_TABLE_KEY]
    assert first.shape == (1, 16, 32)
    out = pretrain(mono, tmp_path / "p2", "--restore-file", str(tmp_path / "p1" / "checkpoint_last.pt"),
                   "--reset-optimizer", "--reset-dataloader", "--reset-meters", tokens=40, max_positions=40,
                   updates=1)
    assert "extended from 16 to 40 positions" in out.stdout + out.stderr
    second = load_state(tmp_path / "p2" / "checkpoint_last.pt")["model"][LEARNED_TABLE_KEY]
    assert second.shape == (1, 40, 32)
    # one Adam step moves each trained row by about lr at most: the first phase's table carried over
    assert float((second[:, :16] - first).abs().max()) < 5e-3


@pytest.mark.parametrize("flags", [["--pe-absolute", "none", "--pe-relative", "learned"],
                                   ["--pe-absolute", "floater", "--pe-all-blocks"]], ids=["rpe", "floater"])
def test_pretraining_other_encodings_and_reload(mono, tmp_path, flags):
    out = pretrain(mono, tmp_path, *flags)
    assert "num_updates 3" in out.stdout
    state = load_state(tmp_path / "checkpoint_last.pt")
    assert state["cfg"]["model"].pe_absolute == flags[1]
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(tmp_path / "checkpoint_last.pt")], arg_overrides={"data": str(mono)})
    d = task.source_dictionary
    tokens = batch(d, [12, 7])
    models[0].eval()
    with torch.no_grad():
        a, _ = models[0](tokens)
        b, _ = models[0](tokens)
    torch.testing.assert_close(a, b)
    assert torch.isfinite(a).all()


@pytest.fixture(scope="module")
def stock_roberta(mono, tmp_path_factory):
    """A checkpoint of fairseq's own ``roberta`` (no plugin), pretrained tinily."""
    save = tmp_path_factory.mktemp("stock")
    pretrain(mono, save, arch="roberta", tokens=32, max_positions=32, user_dir=False)
    return save / "checkpoint_last.pt"


def test_warm_start_from_stock_roberta_is_exact_then_trains_only_the_dynamics(mono, stock_roberta, tmp_path):
    """FLOATER §4.2: a stock RoBERTa checkpoint + FLOATER's Q/K/V biases at h = 0 computes exactly
    what the original did; then training with the body frozen changes the dynamics only."""
    stock = stock_roberta
    out = cli("fairseq-pe-warm-start-roberta", str(stock), str(tmp_path / "floater.pt"), "--data", str(mono),
              "--tolerance", "1e-5")
    diff = float(out.stderr.split("on a random batch: ")[1].split()[0])
    assert diff < 1e-5
    converted = load_state(tmp_path / "floater.pt")
    original = load_state(stock)["model"]
    pad = 1
    torch.testing.assert_close(converted["model"][LEARNED_TABLE_KEY][0],
                               original["encoder.sentence_encoder.embed_positions.weight"][pad + 1:])
    assert converted["args" if converted.get("cfg") is None else "cfg"]["model"].pe_floater_bias

    # re-train the encoding layers only (the body frozen), as the paper does before fine-tuning
    pretrain(mono, tmp_path / "dyn", "--pe-floater-bias", "--pe-floater-freeze-body", "--restore-file",
             str(tmp_path / "floater.pt"), "--reset-optimizer", "--reset-dataloader", "--reset-meters",
             "--max-positions", "32", updates=2)
    after = load_state(tmp_path / "dyn" / "checkpoint_last.pt")["model"]
    changed = sorted(k for k, v in after.items() if not torch.equal(v, converted["model"][k]))
    assert changed and all(k.startswith("floater.") or ".self_bias." in k for k in changed), changed
    assert any(k.startswith("floater.dynamics") for k in changed)


def test_warm_start_to_another_encoding_initialises_it(mono, stock_roberta, tmp_path):
    out = cli("fairseq-pe-warm-start-roberta", str(stock_roberta),
              str(tmp_path / "rpe.pt"), "--data", str(mono), "--pe-absolute", "none", "--pe-relative", "learned")
    assert "dropped encoder.sentence_encoder.embed_positions.weight" in out.stderr
    assert "relative.key_vectors" in out.stderr
    state = load_state(tmp_path / "rpe.pt")
    stock = load_state(stock_roberta)["model"]
    for k, v in stock.items():
        if "embed_positions" not in k:
            torch.testing.assert_close(state["model"][k], v)  # every other weight copied
    pretrain(mono, tmp_path / "ft", "--pe-absolute", "none", "--pe-relative", "learned", "--restore-file",
             str(tmp_path / "rpe.pt"), "--reset-optimizer", "--reset-dataloader", "--reset-meters",
             "--max-positions", "32", updates=1)


def test_warm_start_to_sinusoids_gives_them_roberta_pes_scale(mono, stock_roberta, tmp_path):
    """A new sinusoidal encoding keeps its own scale: roberta_pe's default, not the S = 1 that a checkpoint
    without a scale (saved before it existed) loads with."""
    cli("fairseq-pe-warm-start-roberta", str(stock_roberta), str(tmp_path / "sin.pt"), "--data", str(mono),
        "--pe-absolute", "sinusoidal")
    state = load_state(tmp_path / "sin.pt")["model"]
    scale = state["encoder.sentence_encoder.embed_positions.absolute.sinusoid_scale"]
    assert float(scale) == pytest.approx(ROBERTA_DEFAULTS["absolute"][0])


def test_prepare_mono_never_replaces_results_nor_reads_its_own_outputs(tmp_path, capsys):
    """Issue 14, before any work: an earlier run's files in --destdir need --force; a --destdir inside
    an --input folder (its dict.txt, raw/*.txt would be read as text next time) is refused."""
    from fairseq_pe.data_prep import mono

    def status(argv):
        try:
            return mono.main(argv)
        except SystemExit as e:
            return e.code

    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text("some text\n")
    dest = tmp_path / "bin"
    dest.mkdir()
    (dest / "dict.txt").write_text("an earlier dictionary\n")
    assert status(["--input", str(text), "--destdir", str(dest)]) == 2
    assert "dict.txt exists already (an earlier run's results): pass --force" in capsys.readouterr().err
    assert (dest / "dict.txt").read_text() == "an earlier dictionary\n" and os.listdir(dest) == ["dict.txt"]
    assert status(["--input", str(text), "--destdir", str(text / "bin"), "--force"]) == 2
    assert "is inside --input" in capsys.readouterr().err and os.listdir(text) == ["a.txt"]


def test_a_decoder_option_is_refused_by_name():
    from fairseq_pe.errors import UserError
    with pytest.raises(UserError, match="--pe-random-eval-decoder spaced sets a decoder's positions: roberta_pe has no"):
        build("--pe-random-positions", "64", "--pe-random-eval-decoder", "spaced")
    model, _ = build("--pe-random-positions", "64", "--pe-random-eval-decoder", "indices")
    assert model is not None
