"""Issue 42: ``transformer_lm_pe``, fairseq's language model with every encoding, through fairseq's
``language_modeling`` task, ``fairseq-train``, ``fairseq-eval-lm`` (at any length), ``fairseq-interactive`` and the
hub's ``sample``."""

import argparse
import math
import os
import random
import re
from types import SimpleNamespace

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY

from fairseq_pe import systems
from fairseq_pe.models.transformer_lm_pe import TransformerPELanguageModel

from helpers import (ALL_ENCODINGS, PLUGIN, PRECISION_FLAGS, assert_user_error, cli, dictionary, forked,
                     optimizer_gradients, random_tokens, torchrun)

#: a 2-layer model of 16 dimensions and 2 heads, trained at 16 tokens
SMALL = ["--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2"]
TRAIN_LENGTH = 16
#: the translation models' tolerances (tests/test_half_precision_training.py)
TRAINER_TOLERANCE = {"fp16": 0.1, "memory-efficient-fp16": 0.1, "bf16": 0.4}


def build_lm(*flags, tokens_per_sample=TRAIN_LENGTH, vocab=20, seed=0):
    """A ``transformer_lm_pe_tiny`` (16 dims) built through its real ``add_args``/architecture path, in eval mode."""
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)  # as fairseq does
    TransformerPELanguageModel.add_args(parser)
    args = parser.parse_args([*flags, *SMALL])
    args.tokens_per_sample = tokens_per_sample
    ARCH_CONFIG_REGISTRY["transformer_lm_pe_tiny"](args)
    d = dictionary(vocab)
    torch.manual_seed(seed)
    model = TransformerPELanguageModel.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
    return model.eval(), d


@pytest.mark.parametrize("name", list(ALL_ENCODINGS))
def test_every_encoding_trains_and_decodes_step_by_step_as_the_full_pass(name):
    model, d = build_lm(*ALL_ENCODINGS[name])
    tokens = random_tokens(d, 2, 12)
    # one training step: a finite loss, and every position parameter reached by the gradient
    model.train()
    lprobs = model.get_normalized_probs(model(tokens[:, :-1]), log_probs=True)
    loss = torch.nn.functional.nll_loss(lprobs.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    assert math.isfinite(loss.item())
    positions = model.decoder.embed_positions
    for pname, p in positions.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: {pname} has no gradient"
    model.eval()
    full = model.get_normalized_probs(model(tokens), log_probs=True)
    state = {}
    for t in range(tokens.size(1)):
        step = model.get_normalized_probs(model(tokens[:, :t + 1], incremental_state=state), log_probs=True)
        torch.testing.assert_close(step[:, -1], full[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(ALL_ENCODINGS))
def test_every_encoding_evaluates_at_4x_the_training_length_or_is_refused_by_name(name):
    model, d = build_lm(*ALL_ENCODINGS[name])
    tokens = random_tokens(d, 1, 4 * TRAIN_LENGTH)
    bounded = model.max_positions() < 4 * TRAIN_LENGTH
    assert bounded == (name == "ape-learned"), model.max_positions()
    if bounded:
        with pytest.raises(ValueError, match="--max-target-positions 16"):
            model(tokens)
        return
    with torch.no_grad():
        lprobs = model.get_normalized_probs(model(tokens), log_probs=True)
    assert torch.isfinite(lprobs).all()


def test_the_language_model_reuses_the_plugins_decoder_and_has_no_cross_attention():
    from fairseq_pe.models.attention import PositionAttention
    from fairseq_pe.models.transformer_pe import TransformerPEDecoder

    model, _ = build_lm("--pe-absolute", "none", "--pe-relative", "alibi")
    assert isinstance(model.decoder, TransformerPEDecoder)
    for layer in model.decoder.layers:
        assert isinstance(layer.self_attn, PositionAttention) and layer.encoder_attn is None


def test_fairseqs_own_position_options_are_refused_by_name():
    with pytest.raises(ValueError, match="--decoder-learned-pos .* use --pe-absolute learned"):
        build_lm("--decoder-learned-pos")


# fairseq's trainer on the language-modelling task: fp16, bf16 and the memory-efficient optimizer as for translation


def lm_trainers(data_dir, flags, precisions):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    trainers = {}
    for precision in precisions:
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, [
            str(data_dir), "--user-dir", PLUGIN, "--task", "language_modeling", "--arch", "transformer_lm_pe_tiny",
            "--tokens-per-sample", str(TRAIN_LENGTH), "--cpu", "--optimizer", "adam", "--lr", "0.003", "--dropout",
            "0", "--seed", "1", "--max-tokens", "1000", "--fp16-init-scale", "8", *SMALL, *flags,
            *PRECISION_FLAGS[precision]])
        cfg = convert_namespace_to_omegaconf(args)
        task = tasks.setup_task(cfg.task)
        torch.manual_seed(1)
        model = task.build_model(cfg.model)
        trainers[precision] = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    return trainers


def lm_sample(d: Dictionary, batch=3, length=TRAIN_LENGTH, seed=0):
    tokens = random_tokens(d, batch, length + 1, seed=seed)
    return {"id": torch.arange(batch), "nsentences": batch, "ntokens": batch * length,
            "net_input": {"src_tokens": tokens[:, :-1].contiguous(), "src_lengths": torch.full((batch,), length)},
            "target": tokens[:, 1:].contiguous()}


@pytest.mark.parametrize("name", ["alibi", "rope", "kerple-log", "fire", "t5", "ape-learned", "floater-bias"])
def test_half_precision_training_through_fairseqs_optimizers_is_float32s_rounded(name, tmp_path, cpu_fp16_optimizer):
    """One update of fairseq's trainer in each precision (its FP16Optimizer, bf16 form, MemoryEfficientFP16Optimizer):
    the loss and every position parameter's gradient are float32's within the tolerances of the translation models'
    test (tests/test_half_precision_training.py: a deviation relative to the whole encoding's gradient)."""
    from fairseq_pe.diagnostics.precision import gradient_deviations, position_owners, position_parameters

    dictionary(40).save(str(tmp_path / "dict.txt"))
    precisions = ["fp32", "fp16", "bf16", "memory-efficient-fp16"]
    trainers = lm_trainers(tmp_path, ALL_ENCODINGS[name], precisions)
    sample = lm_sample(trainers["fp32"].task.source_dictionary)
    owners = position_owners(trainers["fp32"].model)
    names = list(position_parameters(trainers["fp32"].model))
    assert bool(names) == systems.get(name).trainable, name  # the registry finds them all
    results = {}
    for precision, trainer in trainers.items():
        log = trainer.train_step([sample])
        assert log is not None and trainer.get_num_updates() == 1, f"{precision}: the update was skipped"
        params = dict(trainer.model.named_parameters())
        grads = optimizer_gradients(trainer.optimizer, [params[n] for n in names])
        results[precision] = (log["loss"], {n: (torch.zeros_like(params[n], dtype=torch.float32) if g is None else g)
                                            for n, g in zip(names, grads)})
    loss, grads = results["fp32"]
    for precision in precisions[1:]:
        half_loss, half_grads = results[precision]
        assert half_loss == pytest.approx(loss, rel=2e-2), precision
        for parameter, deviation in gradient_deviations(half_grads, grads, owners).items():
            assert deviation <= TRAINER_TOLERANCE[precision], (precision, parameter, deviation)


# the command-line tools, on a tiny corpus


def write_corpus(root, seed=0):
    """Lines of counting sequences (a word follows its predecessor), which a tiny model learns in a few updates."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(30)]
    for split, lines in (("train", 300), ("valid", 20), ("test", 20)):
        with open(os.path.join(root, f"{split}.txt"), "w") as f:
            for _ in range(lines):
                start = rng.randrange(30)
                f.write(" ".join(words[(start + k) % 30] for k in range(rng.randint(4, 14))) + "\n")


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    write_corpus(str(root))
    cli("fairseq-preprocess", "--only-source", "--trainpref", root / "train.txt", "--validpref", root / "valid.txt",
        "--testpref", root / "test.txt", "--destdir", root / "bin", "--workers", "1")
    return root


def train_lm(root, name, *extra):
    save = root / f"ck-{name}"
    if not (save / "checkpoint_best.pt").exists():
        cli("fairseq-train", root / "bin", "--user-dir", PLUGIN, "--task", "language_modeling", "--arch",
            "transformer_lm_pe_tiny", "--tokens-per-sample", str(TRAIN_LENGTH), "--sample-break-mode", "none",
            *systems.get(name).flags, "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "512",
            "--max-update", "20", "--save-dir", save, "--no-epoch-checkpoints", "--cpu", "--seed", "1",
            "--num-workers", "0", "--log-format", "simple", *extra)
    return save / "checkpoint_best.pt"


def split_tokens(root, split="test"):
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(str(root / "bin" / split), None)  # its sizes are a view of its mmap
    return int(dataset.sizes.sum())


def eval_lm(root, checkpoint, *flags, check=True):
    return cli("fairseq-eval-lm", root / "bin", "--path", checkpoint, "--user-dir", PLUGIN, "--gen-subset", "test",
               "--max-tokens", "4096", "--cpu", "--num-workers", "0", *flags, check=check)


def perplexity(proc):
    text = proc.stdout + proc.stderr
    evaluated = int(re.search(r"Evaluated ([\d,]+) tokens", text).group(1).replace(",", ""))
    return evaluated, float(re.search(r"Perplexity: ([\d.]+)", text).group(1))


def test_eval_lm_at_4x_the_training_length_scores_every_token(lm_data):
    checkpoint = train_lm(lm_data, "alibi")
    total = split_tokens(lm_data)
    at_l = perplexity(eval_lm(lm_data, checkpoint, "--tokens-per-sample", str(TRAIN_LENGTH)))
    at_4l = perplexity(eval_lm(lm_data, checkpoint, "--tokens-per-sample", str(4 * TRAIN_LENGTH)))
    sliding = perplexity(eval_lm(lm_data, checkpoint, "--tokens-per-sample", str(4 * TRAIN_LENGTH),
                                 "--context-window", str(3 * TRAIN_LENGTH)))
    for evaluated, ppl in (at_l, at_4l, sliding):
        assert evaluated == total and 1 < ppl < 30, (evaluated, total, ppl)  # 30 words: a model that learned
    assert at_4l[1] != at_l[1]


@pytest.mark.parametrize("name", ["fox", "cope", "kerple-log-dape", "alibi-dape2"])
def test_the_logits_hook_encodings_train_and_evaluate_at_4x_the_training_length(lm_data, name):
    """FoX, CoPE and DAPE v1, v2 (issue 43), which compute the attention's logits themselves: fairseq-train, then
    fairseq-eval-lm at 4x the training length scores every token of the split."""
    checkpoint = train_lm(lm_data, name)
    evaluated, ppl = perplexity(eval_lm(lm_data, checkpoint, "--tokens-per-sample", str(4 * TRAIN_LENGTH)))
    assert evaluated == split_tokens(lm_data) and 1 < ppl < 30, (evaluated, ppl)


def test_eval_lm_past_a_learned_table_is_refused_by_name_not_skipped(lm_data):
    checkpoint = train_lm(lm_data, "ape-learned")
    assert perplexity(eval_lm(lm_data, checkpoint, "--tokens-per-sample", str(TRAIN_LENGTH)))[0] == \
        split_tokens(lm_data)
    proc = eval_lm(lm_data, checkpoint, "--tokens-per-sample", str(4 * TRAIN_LENGTH), check=False)
    assert_user_error(proc, "fairseq-eval-lm", "would be skipped", "--tokens-per-sample", str(TRAIN_LENGTH),
                      "--max-target-positions 16")
    assert "Perplexity" not in proc.stdout + proc.stderr
    sliding = eval_lm(lm_data, checkpoint, "--tokens-per-sample", str(2 * TRAIN_LENGTH), "--context-window",
                      str(TRAIN_LENGTH), check=False)
    assert_user_error(sliding, "fairseq-eval-lm", f"--tokens-per-sample {2 * TRAIN_LENGTH} with --context-window",
                      f"at most {TRAIN_LENGTH}")


def test_rope_scaling_applies_at_evaluation_through_model_overrides(lm_data):
    checkpoint = train_lm(lm_data, "rope")
    length = ["--tokens-per-sample", str(4 * TRAIN_LENGTH)]
    plain = perplexity(eval_lm(lm_data, checkpoint, *length))
    scaled = perplexity(eval_lm(lm_data, checkpoint, *length, "--model-overrides",
                                "{'pe_rope_scaling': 'yarn', 'pe_rope_scaling_factor': 4, "
                                f"'pe_rope_scaling_original_length': {TRAIN_LENGTH}}}"))
    # Resonance RoPE (Wang et al. 2024) at evaluation, with the same YaRN (its wavelengths rounded after the scaling)
    resonant = perplexity(eval_lm(lm_data, checkpoint, *length, "--model-overrides",
                                  "{'pe_rope_resonance': True, 'pe_rope_scaling': 'yarn', 'pe_rope_scaling_factor': 4, "
                                  f"'pe_rope_scaling_original_length': {TRAIN_LENGTH}}}"))
    # ReRoPE (Su 2023): the relative position capped at the training length, queries log-scaled past it
    capped = perplexity(eval_lm(lm_data, checkpoint, *length, "--model-overrides",
                                f"{{'pe_rerope_window': {TRAIN_LENGTH}, 'pe_rerope_train_length': {TRAIN_LENGTH}}}"))
    assert plain[0] == scaled[0] == resonant[0] == capped[0] == split_tokens(lm_data)
    assert len({plain[1], scaled[1], resonant[1], capped[1]}) == 4


def test_interactive_and_the_hub_generate_from_a_trained_model(lm_data, tmp_path):
    with forked():  # its training (if not done yet) from the fork server, fairseq-interactive fresh
        checkpoint = train_lm(lm_data, "alibi")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("w3 w4 w5\n")
    proc = cli("fairseq-interactive", lm_data / "bin", "--path", checkpoint, "--user-dir", PLUGIN, "--task",
               "language_modeling", "--cpu", "--beam", "2", "--max-len-b", "6", "--input", prompt)
    hypothesis = [line.split("\t")[2].split() for line in proc.stdout.splitlines() if line.startswith("H-0\t")]
    assert len(hypothesis) == 1 and hypothesis[0][:3] == ["w3", "w4", "w5"] and len(hypothesis[0]) > 3, proc.stdout
    hub = TransformerPELanguageModel.from_pretrained(str(checkpoint.parent), checkpoint_file="checkpoint_best.pt",
                                                     data_name_or_path=str(lm_data / "bin"))
    hub.eval()
    words = hub.sample("w3 w4 w5", beam=1, sampling=False, max_len_b=6).split()
    assert words[:3] == ["w3", "w4", "w5"] and len(words) > 3, words
    # greedy continuation of a counting sequence by a model that learned it
    assert words[3] == "w6", words


def test_two_processes_reduce_float32_position_gradients_in_float32_under_bf16(lm_data, tmp_path):
    """DDP as for translation (tests/test_ddp_half_precision.py): ``torchrun --nproc_per_node 2`` with gloo, --bf16,
    KERPLE's float32 parameters; fairseq's legacy_ddp (one flat buffer) ends where c10d (a bucket per dtype) ends."""
    from fairseq import checkpoint_utils

    def train(backend):
        save = tmp_path / backend
        run = cli(*torchrun("fairseq-train"), lm_data / "bin", "--user-dir", PLUGIN, "--task", "language_modeling",
                  "--arch", "transformer_lm_pe_tiny", *SMALL, "--tokens-per-sample", str(TRAIN_LENGTH),
                  *systems.get("kerple-log").flags, "--bf16", "--ddp-backend", backend, "--optimizer", "adam",
                  "--lr", "0.003", "--max-tokens", "128", "--max-update", "3", "--cpu", "--distributed-backend",
                  "gloo", "--num-workers", "0", "--seed", "1", "--dropout", "0", "--no-epoch-checkpoints",
                  "--no-save-optimizer-state", "--disable-validation", "--save-dir", save)
        log = run.stdout + run.stderr
        assert "distributed init (rank 1)" in log and log.count("done training in") == 1, log[-3000:]
        return checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))["model"]

    c10d, legacy = train("c10d"), train("legacy_ddp")
    positions = [k for k in c10d if ".relative." in k]
    assert positions and all(c10d[k].dtype == torch.float32 for k in positions)
    for key in positions:
        torch.testing.assert_close(legacy[key], c10d[key], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["alibi", "rope", "fire"])
def test_long_evaluation_of_the_language_model_is_linear_in_memory(name, monkeypatch):
    """A decoder-only pass at T tokens holds nothing of T × T: fairseq's future mask is a stand-in of no storage (its
    rows are built per block), ALiBi's and FIRE's biases go through the blocks path, RoPE through the causal kernel.
    Stock fairseq's decoder caches a T × T float future mask."""
    from fairseq.models.transformer import TransformerDecoderBase

    from fairseq_pe.models import attention

    from test_long_context import largest_storage_created

    monkeypatch.setattr(attention, "AUTO_BLOCKS_ELEMENTS", 1 << 14)
    monkeypatch.setattr(attention, "EVAL_BLOCK_ELEMENTS", 1 << 12)
    length = 512
    model, d = build_lm(*ALL_ENCODINGS[name])
    tokens = random_tokens(d, 1, length)
    with torch.no_grad():
        largest = largest_storage_created(lambda: model(tokens))
        stock_mask = largest_storage_created(lambda: TransformerDecoderBase.buffered_future_mask(model.decoder,
                                                                                                  torch.zeros(length)))
    assert stock_mask >= length * length  # what the test would catch
    ffn = model.decoder.layers[0].fc1.out_features
    assert largest <= length * max(ffn, len(d), 4 * model.decoder.embed_tokens.embedding_dim), largest


@pytest.mark.parametrize("flags, message", [
    (["--context-window", "-1"], "--context-window must be 0 or more"),
    (["--tokens-per-sample", "0"], "--tokens-per-sample must be at least 1, got 0"),
    (["--tokens-per-sample", "-5"], "--tokens-per-sample must be at least 1, got -5"),
    (["--tokens-per-sample", "8", "--context-window", "8"], "--context-window 8 must be smaller than "
                                                            "--tokens-per-sample 8"),
    (["--tokens-per-sample", "16", "--max-tokens", "1"], "--max-tokens 1 cannot hold one window's 16 scored tokens "
                                                         "(--tokens-per-sample): give at least 16"),
    (["--tokens-per-sample", "16", "--context-window", "12", "--max-tokens", "3"],
     "--max-tokens 3 cannot hold one window's 4 scored tokens (--tokens-per-sample 16 − --context-window 12"),
    (["--gen-subset", "nosuch"], "--gen-subset nosuch: no such split in"),
    # a sentence kept whole is longer than a batch: fairseq's Cython assertion before (fairseq-eval-lm's default
    # --max-tokens, 36000, against a longer sentence, here 8 against the corpus's 5-15 tokens)
    (["--sample-break-mode", "eos", "--tokens-per-sample", "4", "--max-tokens", "8"],
     "samples are longer than a batch may hold (the longest has 14 tokens), and fairseq batches every sample whole; "
     "give --max-tokens 14 or more"),
])
def test_eval_lm_options_that_cannot_evaluate_are_one_line(lm_data, flags, message):
    """Issue 55, 5 and 6: a negative --context-window was evaluated as none (exit 0); the others were tracebacks."""
    checkpoint = train_lm(lm_data, "alibi")
    proc = eval_lm(lm_data, checkpoint, *flags, check=False)
    assert_user_error(proc, "fairseq-eval-lm", message)
    assert "Perplexity" not in proc.stdout + proc.stderr


def test_a_sliding_window_batch_is_counted_in_scored_tokens(lm_data):
    """fairseq batches a sliding window by its scored tokens (``LMContextWindowDataset.num_tokens``): --max-tokens 8
    holds two windows of 16 tokens scoring 4 each, and gives the perplexity of batches of 4096.  The check refused
    it when it counted the context too (fairseq-pe-lm-lengths' windows of 16 L at --max-tokens 8192 recorded as
    refused)."""
    checkpoint = train_lm(lm_data, "alibi")
    window = ("--tokens-per-sample", "16", "--context-window", "12")
    small = perplexity(eval_lm(lm_data, checkpoint, *window, "--max-tokens", "8"))
    assert small == perplexity(eval_lm(lm_data, checkpoint, *window))  # eval_lm's own --max-tokens 4096


def test_complete_doc_says_which_tokens_it_leaves_out(lm_data, tmp_path):
    """Issue 55, 5: ``--sample-break-mode complete_doc`` scored all but the empty lines between documents without a
    word; one line now says how many and why, and the count matches fairseq's own."""
    checkpoint = train_lm(lm_data, "alibi")
    text = (lm_data / "test.txt").read_text().splitlines()
    with open(tmp_path / "docs.txt", "w") as f:
        f.write("\n".join(line + ("\n" if i % 6 == 5 else "") for i, line in enumerate(text)) + "\n")
    separators = len(text) // 6
    cli("fairseq-preprocess", "--only-source", "--testpref", tmp_path / "docs.txt", "--srcdict",
        lm_data / "bin" / "dict.txt", "--destdir", tmp_path / "bin", "--workers", "1")
    total = sum(len(line.split()) + 1 for line in text) + separators
    proc = cli("fairseq-eval-lm", tmp_path / "bin", "--path", checkpoint, "--user-dir", PLUGIN, "--gen-subset", "test",
               "--cpu", "--num-workers", "0", "--sample-break-mode", "complete_doc")
    evaluated, _ = perplexity(proc)
    assert evaluated == total - separators
    assert (f"--sample-break-mode complete_doc: the {separators} empty lines of test separate documents and are not "
            f"scored (fairseq leaves them out of every block): {evaluated:,} of {total:,} tokens") in proc.stderr
    full, _ = perplexity(cli("fairseq-eval-lm", tmp_path / "bin", "--path", checkpoint, "--user-dir", PLUGIN,
                             "--gen-subset", "test", "--cpu", "--num-workers", "0", "--sample-break-mode", "eos"))
    assert full == total  # and the default --max-tokens holds every sentence (issue 55, 6)


def test_a_language_model_given_to_translation_is_one_line(lm_data, tmp_path):
    """Issue 55, 6: fairseq-generate --task translation built the language model over the translation
    dictionaries and failed loading its weights (torch's size mismatch, a traceback)."""
    checkpoint = train_lm(lm_data, "alibi")
    for side in ("src", "tgt"):
        (tmp_path / f"test.{side}").write_text((lm_data / "test.txt").read_text())
    cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", tmp_path / "test",
        "--testpref", tmp_path / "test",
        "--destdir", tmp_path / "bin", "--joined-dictionary", "--workers", "1")
    proc = cli("fairseq-generate", tmp_path / "bin", "--path", checkpoint, "--user-dir", PLUGIN, "--cpu", "--beam",
               "1", "--gen-subset", "test", check=False)
    assert_user_error(proc, "fairseq-generate", "the checkpoint's model is transformer_lm_pe, a language model",
                      "fairseq-eval-lm")
