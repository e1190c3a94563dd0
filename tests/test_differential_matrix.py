"""The differential matrix (issue 54): every system of the catalogue (``fairseq_pe.systems``, so that a new encoding
is covered the day it is added, and ReRoPE at inference) computes the same numbers in every configuration a user
runs, against one reference: the explicit backend in float64, each sentence alone (no padding).

The axes, and what is sampled (the full product would not fit CI's budget):

* model: the encoder and the decoder of ``transformer_pe`` (systems that are not causal-only), and the language model
  ``transformer_lm_pe`` (every system);
* padding: none (each sentence alone), left, right (a batch of three sentences of different lengths);
* pass: the full forward; step by step with a beam reorder (duplicating one row: ``new_order = [2, 0, 0]``), with
  left padding and none (right padding comes after the last real token, which step-by-step decoding has already
  computed by then);
* backend: every one the planner can choose (``sdpa``, ``blocks``, ``flex``, ``explicit``; ``auto`` and
  ``blockwise`` in training mode, where ``blockwise`` checkpoints its blocks), set through ``kernel`` as
  ``--pe-attention-kernel`` does (``flex`` only where the encoding has a score_mod: elsewhere the planner falls back
  to the backends already run; eager FlexAttention, which tests/test_flex.py compares with the compiled kernel);
* dtype: every backend in float64 but ``flex`` (float32: the CPU's FlexAttention has no float64); ``auto`` in float32
  and bf16 (float32 to 1e-4, bf16 finite and within 0.25).

Sampled: the dtypes (float32 and bf16 run the backend ``auto`` only) and the training-mode forwards (float64, no
randomised positions, which training draws).  Why the sample still catches each defect of the issue: right padding
against each sentence alone catches DAPE v2's padding keys (3); the left-padded step-by-step pass catches the padding
flag read from the new token's mask (4) and the NaN of an all-padding row of fairseq's own attention (7); float64 on
every backend catches the float32-only paths (6); training mode on ``auto`` and ``blockwise`` catches a path chosen
from the grad mode only together with dropout, which tests/test_attention_planner.py's finite-difference check does
(1), as it does the threads (2), the memo (5) and the storage; FIRE-DAPE's reference is
tests/test_reference_outputs.py (8).
"""

import argparse
from types import SimpleNamespace

import pytest
import torch
from fairseq.models import ARCH_CONFIG_REGISTRY

from fairseq_pe import systems as catalogue
from fairseq_pe.models import flex
from fairseq_pe.models.attention import PositionAttention
from fairseq_pe.models.transformer_lm_pe import TransformerPELanguageModel
from fairseq_pe.models.transformer_pe import TransformerPEModel

from helpers import dictionary

#: tiny sizes: 2 layers of 16 dimensions and 2 heads; Shaw's distances clipped at 4 (the sentences go past it)
SIZES = {"encoder": ["--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2"],
         "decoder": ["--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2"]}
EXTRA = {"--pe-relative-max-distance": "4"}
#: ReRoPE at inference (a window of 3, scaled queries from position 5), on RoPE's model
VARIANTS = {"rope-rerope": ("rope", {"pe_rerope_window": 3, "pe_rerope_train_length": 5}),
            "rope-leaky-rerope": ("rope", {"pe_rerope_window": 3, "pe_rerope_train_length": 5,
                                           "pe_rerope_leaky_factor": 4.0})}
#: every system once: floater-warm is floater-bias's model (its warm start is a training procedure)
NAMES = [name for name in catalogue.SYSTEMS if name != "floater-warm"] + list(VARIANTS)
LENGTHS = (7, 5, 3)
EVAL_BACKENDS = ("sdpa", "blockwise", "flex", "explicit")  # "blockwise" in evaluation is the blocks backend
TRAIN_BACKENDS = ("auto", "blockwise")


def flags_of(name):
    base, overrides = VARIANTS.get(name, (name, {}))
    flags = catalogue.flags(base)
    if catalogue.get(base).relative in ("learned", "sinusoidal"):
        flags = flags + [x for kv in EXTRA.items() for x in kv]
    return flags, overrides


def build(name, kind, seed=0):
    flags, overrides = flags_of(name)
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    model_class = TransformerPELanguageModel if kind == "lm" else TransformerPEModel
    model_class.add_args(parser)
    args = parser.parse_args(flags + SIZES["decoder"] + ([] if kind == "lm" else SIZES["encoder"]))
    for key, value in overrides.items():
        setattr(args, key, value)
    args.dropout = args.attention_dropout = 0.0
    if kind == "lm":
        args.tokens_per_sample = 16
        ARCH_CONFIG_REGISTRY["transformer_lm_pe_tiny"](args)
    else:
        ARCH_CONFIG_REGISTRY["transformer_pe_tiny"](args)
    d = dictionary(20)
    torch.manual_seed(seed)
    model = model_class.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
    return model.eval(), d


def set_kernel(model, kernel):
    for module in model.modules():
        if isinstance(module, PositionAttention):
            module.kernel = kernel


def sentences(d, lengths=LENGTHS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(d.nspecial, len(d), (n,), generator=g) for n in lengths]


def batch(d, rows, side):
    """(B, T) tokens padded on ``side`` and, per row, the index of its first real token."""
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), d.pad())
    starts = []
    for i, r in enumerate(rows):
        start = width - len(r) if side == "left" else 0
        tokens[i, start:start + len(r)] = r
        starts.append(start)
    return tokens, starts


def lm_outputs(model, tokens):
    return model.get_normalized_probs(model(tokens), log_probs=True)  # (B, T, V)


def translation_outputs(model, d, src, prev):
    enc = model.encoder(src, src.ne(d.pad()).sum(1))
    encoded = enc["encoder_out"][0].transpose(0, 1)  # (B, S, C)
    log_probs = model.get_normalized_probs(model.decoder(prev, encoder_out=enc), log_probs=True)
    return encoded, log_probs


def targets(d, rows):
    """Each target with eos first, as fairseq's prev_output_tokens."""
    return [torch.cat([torch.tensor([d.eos()]), r]) for r in rows]


def cast(model, dtype, weights):
    """``model`` in ``dtype``, with the float64 ``weights`` (each cast from them: no bf16 round trip kept)."""
    model.to(dtype)
    model.load_state_dict(weights)
    return model


class Case:
    """One system in one model kind: its float64 explicit reference per sentence, and the comparisons."""

    def __init__(self, name, kind):
        self.name, self.kind = name, kind
        self.model, self.d = build(name, kind)
        self.model.double()
        self.weights = {k: v.clone() for k, v in self.model.state_dict().items()}
        d = self.d
        self.src = sentences(d)
        self.tgt = targets(d, sentences(d, (5, 6, 4), seed=1))
        self.reference = self.run_alone(torch.float64, "explicit")

    def forward(self, rows_src, rows_tgt, side):
        d, model = self.d, self.model
        if self.kind == "lm":
            tokens, starts = batch(d, rows_tgt, side)
            return {"lm": (lm_outputs(model, tokens), starts, [len(r) for r in rows_tgt])}
        src, src_starts = batch(d, rows_src, side)
        prev, prev_starts = batch(d, rows_tgt, "right")  # fairseq's targets are padded on the right
        encoded, log_probs = translation_outputs(model, d, src, prev)
        return {"encoder": (encoded, src_starts, [len(r) for r in rows_src]),
                "decoder": (log_probs, prev_starts, [len(r) for r in rows_tgt])}

    def run_alone(self, dtype, kernel):
        cast(self.model, dtype, self.weights)
        set_kernel(self.model, kernel)
        out = {}
        with torch.no_grad():
            for i in range(len(LENGTHS)):
                got = self.forward([self.src[i]], [self.tgt[i]], "none")
                for part, (values, starts, lengths) in got.items():
                    out.setdefault(part, []).append(values[0, :lengths[0]].double())
        return out

    def run_batch(self, dtype, kernel, side, training=False):
        """The outputs at each sentence's real tokens: in one batch padded on ``side``, or (``none``) each sentence
        in a batch of its own."""
        cast(self.model, dtype, self.weights)
        set_kernel(self.model, kernel)
        self.model.train(training)
        batches = [(self.src, self.tgt)] if side != "none" else [([s], [t]) for s, t in zip(self.src, self.tgt)]
        out = {}
        try:
            with torch.set_grad_enabled(training):
                for rows_src, rows_tgt in batches:
                    for part, (values, starts, lengths) in self.forward(rows_src, rows_tgt, side).items():
                        out.setdefault(part, []).extend(values[i, s:s + n].detach().double()
                                                        for i, (s, n) in enumerate(zip(starts, lengths)))
        finally:
            self.model.eval()
        return out

    def compare(self, got, label, atol):
        for part, rows in got.items():
            for i, row in enumerate(rows):
                want = self.reference[part][i]
                assert torch.isfinite(row).all(), f"{self.name} {self.kind} {part} {label}: row {i} not finite"
                error = (row - want).abs().max().item()
                assert error <= atol, f"{self.name} {self.kind} {part} {label}: row {i} off by {error:.3g}"

    def step_by_step(self, dtype, side):
        """Log-probs of step-by-step decoding with a beam reorder at step 3, against the full pass of the tokens
        each row has then (row r continues row new_order[r]'s history).  The language model's rows are padded on
        ``side``; the translation model decodes two sentences with two beams each (their sources padded on
        ``side``), reordered within each sentence's beams as beam search does (fairseq keeps the cross-attention's
        keys of a beam, which all beams of a sentence share)."""
        d, model = self.d, self.model
        cast(model, dtype, self.weights)
        set_kernel(model, "auto")
        if self.kind == "lm":
            tokens, starts = batch(d, self.tgt, side)
            new_order, src = torch.tensor([2, 0, 0]), None
        else:
            width = max(len(r) for r in self.tgt)
            g = torch.Generator().manual_seed(5)
            tokens = torch.stack([torch.cat([self.tgt[i % 3], torch.randint(
                d.nspecial, len(d), (width - len(self.tgt[i % 3]),), generator=g)]) for i in range(4)])
            starts = [0] * 4
            new_order = torch.tensor([1, 1, 3, 2])
            src, _ = batch(d, [self.src[0], self.src[0], self.src[1], self.src[1]], side)
        reorder_at = 3
        history = tokens[new_order]  # each row's tokens from the reorder on
        enc = None if src is None else model.encoder(src, src.ne(d.pad()).sum(1))
        state, steps = {}, []
        with torch.no_grad():
            for t in range(tokens.size(1)):
                if t == reorder_at:
                    model.decoder.reorder_incremental_state_scripting(state, new_order)
                    if enc is not None:
                        enc = model.encoder.reorder_encoder_out(enc, new_order)
                step_tokens = (tokens if t < reorder_at else history)[:, :t + 1]
                out = model.decoder(step_tokens, encoder_out=enc, incremental_state=state) if enc is not None else \
                    model.decoder(step_tokens, incremental_state=state)
                steps.append(model.get_normalized_probs(out, log_probs=True)[:, -1].double())

            def full(rows, encoder_out):
                out = model.decoder(rows, encoder_out=encoder_out) if src is not None else model.decoder(rows)
                return model.get_normalized_probs(out, log_probs=True).double()

            full_before = full(tokens, None if src is None else model.encoder(src, src.ne(d.pad()).sum(1)))
            full_after = full(history, enc)
        starts_after = [starts[i] for i in new_order.tolist()]
        for t, step in enumerate(steps):
            full_pass, first = (full_before, starts) if t < reorder_at else (full_after, starts_after)
            for row in range(step.size(0)):
                if t < first[row]:
                    continue  # a padding position: its output is not used
                assert torch.isfinite(step[row]).all(), f"{self.name} {self.kind} step {t} row {row}: not finite"
                error = (step[row] - full_pass[row, t]).abs().max().item()
                assert error <= 1e-5, f"{self.name} {self.kind} step-by-step ({side}) step {t} row {row}: {error:.3g}"

def kinds_of(name):
    system = catalogue.get(VARIANTS.get(name, (name,))[0])
    return ["lm"] if system.causal_only else ["translation", "lm"]


CASES = [(name, kind) for name in NAMES for kind in kinds_of(name)]


@pytest.fixture
def eager_flex(monkeypatch):
    """FlexAttention run eagerly (its semantics, scores materialised): no compilation of a kernel per shape here
    (tests/test_flex.py compares the compiled CPU kernel with the eager one)."""
    from torch.nn.attention.flex_attention import flex_attention

    from fairseq_pe.models import flex

    monkeypatch.setattr(flex, "_call_compiled", lambda q, k, v, score_mod, mask, scale: flex_attention(
        q, k, v, score_mod=score_mod, block_mask=mask, scale=scale))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name,kind", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_every_configuration_computes_the_reference(name, kind, eager_flex):
    case = Case(name, kind)
    base = VARIANTS.get(name, (name,))[0]
    sampled = "--pe-random-positions" in catalogue.flags(base)
    for side in ("none", "left", "right"):
        for kernel in EVAL_BACKENDS:
            if kernel == "flex" and flex.flex_supported(case.model.decoder.embed_positions.relative, "cpu") is not None:
                continue  # the planner falls back to auto's backend, which "sdpa" and "blockwise" already ran
            # FlexAttention on the CPU computes in float32 (the planner refuses it float64 there)
            dtype, atol = (torch.float32, 1e-4) if kernel == "flex" else (torch.float64, 1e-6)
            case.compare(case.run_batch(dtype, kernel, side), f"{side} padding, {kernel}, {dtype}", atol)
        case.compare(case.run_batch(torch.float32, "auto", side), f"{side} padding, auto, float32", 1e-4)
        case.compare(case.run_batch(torch.bfloat16, "auto", side), f"{side} padding, auto, bf16", 0.25)
        if not sampled and name not in VARIANTS:  # ReRoPE is an inference variant; training draws random positions
            for kernel in TRAIN_BACKENDS:
                case.compare(case.run_batch(torch.float64, kernel, side, training=True),
                             f"{side} padding, {kernel}, float64, training mode", 1e-6)
    for side in ("none", "left") if kind == "lm" else ("left", "right"):  # the LM's padding; the source's
        case.step_by_step(torch.float64, side)
