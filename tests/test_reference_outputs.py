"""Issue 43's encodings against the outputs of their reference implementations.

``tests/fixtures/references-43/*.pt`` hold fixed random inputs, the weights that matter and what each reference's own
code computed from them (written by ``make.py`` there, which runs the references only; none of their code is in this
repository).  Each test copies the same weights into fairseq-pe's module, runs it through its public interface on
the same inputs and asserts agreement to float32 rounding (1e-5 absolute; the outputs are of order 1 to 10).
"""
import argparse
import json
import math
import os

import pytest
import torch

from fairseq_pe import systems as catalogue
from fairseq_pe.positional.fourier_rotary import FourierPositionEncoding
from fairseq_pe.positional.injector import Source
from fairseq_pe.positional.partial_rotary import PartialRotaryPositionEncoding
from fairseq_pe.positional.pass_state import pass_scope
from fairseq_pe.positional.rotary import RotaryPositionEncoding
from helpers import FIXTURES, build_model, random_tokens

REFERENCES = os.path.join(FIXTURES, "references-43")
TOLERANCE = 1e-5
BLOCK = 2  # the second layer: its own weights, as the references' are per layer
SMALL = ("--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-attention-heads", "2",
         "--decoder-attention-heads", "2", "--dropout", "0", "--attention-dropout", "0", "--pe-absolute", "none")


def fixture(name):
    return torch.load(os.path.join(REFERENCES, f"{name}.pt"), weights_only=True)


def assert_close(ours, reference):
    assert ours.shape == reference.shape
    difference = (ours - reference).abs().max().item()
    assert difference < TOLERANCE, f"max |ours - reference| = {difference:.3e}"


def half_split(x):
    """Our pairs (2o, 2o + 1) -> the references' half-split pairs (o, o + d/2)."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], -1)


def interleaved(x):
    """The references' half-split pairs (o, o + d/2) -> our pairs (2o, 2o + 1)."""
    half = x.size(-1) // 2
    return torch.stack([x[..., :half], x[..., half:]], -1).flatten(-2)


def self_attention(side, ref, x, causal, pad=None):
    """Our ``BLOCK``-th self-attention with the reference's q, k, v weights (no biases) and no output projection,
    run on ``x`` (T, B, E) in a pass of ``side``'s encoding."""
    attn = side.layers[BLOCK - 1].self_attn
    T, B, E = x.shape
    with torch.no_grad():
        for proj, weight in ((attn.q_proj, ref["wq"]), (attn.k_proj, ref["wk"]), (attn.v_proj, ref["wv"]),
                             (attn.out_proj, torch.eye(E))):
            proj.weight.copy_(weight)
            proj.bias.zero_()
        tokens = random_tokens(side.dictionary, B, T)
        if pad is not None:
            tokens[pad] = side.dictionary.pad()
        future = side.buffered_future_mask(x) if causal else None
        with pass_scope(side.embed_positions.build_pass(tokens, source=Source(5, B, None) if causal else None)):
            return [attn(query=x, key=x, value=x, key_padding_mask=pad, attn_mask=future, need_weights=weights)[0]
                    for weights in (False, True)]  # the blockwise and the explicit path


@pytest.mark.parametrize("side_name, gates", [("decoder", "causal"), ("encoder", "bidirectional")])
def test_fox_gate_bias_equals_x_transformers_data_dependent_alibi(side_name, gates):
    """lucidrains/x-transformers @ 9252ed7, ``x_transformers/x_transformers.py``, ``DataDependentAlibi(causal=...)``:
    its bias from the same gate weights equals our ``forgetting_bias`` on every visible (query, key) pair; the
    encoder's bidirectional form (separate forward and backward gates) is the one it defines."""
    ref = fixture("fox")
    model, _ = build_model(*SMALL, "--pe-relative", "fox")
    fox = getattr(model, side_name).embed_positions.relative
    with torch.no_grad():
        fox.gate_weight[BLOCK - 1].copy_(ref[f"{gates}_gate_weight"])
        fox.gate_bias[BLOCK - 1].copy_(ref[f"{gates}_gate_bias"])
        x = ref["x"]
        bias = fox.forgetting_bias(fox.key_state(x, None, BLOCK), 0, x.size(0))
    visible = torch.ones(x.size(0), x.size(0), dtype=torch.bool)
    if gates == "causal":
        visible = visible.tril()
    assert_close(bias[..., visible], ref[f"{gates}_bias"][..., visible])


def test_fox_attention_equals_the_forgetting_transformer_layer():
    """zhixuan-lin/forgetting-transformer @ 883f260, ``ForgettingAttentionLayer`` (modeling_forgetting_transformer.py;
    its gates ``logsigmoid`` in float32) with the kernel's equation of ``ops/forgetting_attention.py``
    (``softmax(sm_scale q·k + Λ_i − Λ_j) v``, ``Λ = cumsum(log_fgate)``) on what the layer hands the kernel: our
    decoder self-attention output and bias equal it."""
    ref = fixture("fox")
    model, _ = build_model(*SMALL, "--pe-relative", "fox")
    fox = model.decoder.embed_positions.relative
    x = ref["x"]
    with torch.no_grad():
        fox.gate_weight[BLOCK - 1].copy_(ref["causal_gate_weight"])
        fox.gate_bias[BLOCK - 1].copy_(ref["causal_gate_bias"])
        bias = fox.forgetting_bias(fox.key_state(x, None, BLOCK), 0, x.size(0))
    visible = torch.ones(x.size(0), x.size(0), dtype=torch.bool).tril()
    assert_close(bias[..., visible], ref["layer_bias"][..., visible])
    for out in self_attention(model.decoder, ref, x, causal=True):
        assert_close(out, ref["layer_output"])


@pytest.mark.parametrize("side_name", ["decoder", "encoder"])
@pytest.mark.parametrize("nodiv", [False, True])
def test_cope_equals_ram_context_position_attention(side_name, nodiv):
    """facebookresearch/RAM @ e6f051f, ``projects/cope/src/cope/context_position.py``, ``ContextPosSelfAttn``, with
    its DecoderCore (causal × padding) or EncoderCore (padding) mask, ``cope_nodiv`` off and on, npos 5 (positions
    clamped): our self-attention output equals it on every real token, with the same table."""
    ref = fixture("cope")
    case = ref[f"{side_name}_{'nodiv' if nodiv else 'div'}"]
    flags = ["--pe-relative", "cope", "--pe-cope-npos", str(int(ref["npos"]))] + (["--pe-cope-nodiv"] if nodiv else [])
    model, _ = build_model(*SMALL, *flags)
    side = getattr(model, side_name)
    with torch.no_grad():
        side.embed_positions.relative.pos_emb[BLOCK - 1].copy_(case["table"])
    real = ~ref["pad"].t()
    for out in self_attention(side, ref, ref["x"], causal=side_name == "decoder", pad=ref["pad"]):
        assert_close(out[real], case["output"][real])


@pytest.mark.parametrize("relative", ["alibi", "kerple-log"])
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_dape_equals_the_dape_repository(relative, version):
    """chuanyang-Zheng/DAPE @ bde344a: v1 ``DAPE.py`` (``AliBi_DAPE``, ``ParallelKerpleLog_DAPE``), v2
    ``megatron/model/positional_embeddings.py`` (``Alibi_DAPEV2``, ``Kerple_DAPEV2``), in the attention of
    ``megatron/model/transformer.py`` (S = q·k/√d, PE(S) unmasked, causal mask, softmax, × V), same MLP/convolution
    and KERPLE weights.  v1: every row equal.  v2: our causal rows are computed as if k//2 zero keys followed (see
    dape.py): equal to the reference's rows that have k//2 = 1 keys after them, and the last row equal to the
    reference given one more (masked) key."""
    ref = fixture("dape")
    case = ref[f"{relative.replace('-', '_')}_{version}"]
    model, _ = build_model(*SMALL, "--pe-relative", relative, "--pe-dape", version)
    dape = model.decoder.embed_positions.relative
    with torch.no_grad():
        for name in ("w1", "b1", "w2", "b2"):
            getattr(dape, name)[BLOCK - 1].copy_(case[name])
        if relative == "kerple-log":
            dape.base.r1.copy_(case["r1"].expand_as(dape.base.r1))
            dape.base.r2.copy_(case["r2"].expand_as(dape.base.r2))
    for out in self_attention(model.decoder, ref, ref["x"], causal=True):
        if version == "v1":
            assert_close(out, case["output"])
        else:
            assert_close(out[:-1], case["output"][:-1])
            assert_close(out[-1], case["longer"][-1])


def test_fire_dape_equals_the_dape_repositorys_fire_dape():
    """chuanyang-Zheng/DAPE @ bde344a, ``DAPE.py`` ``FIRE_DAPE`` (LeakyReLU in FIRE's MLP) with L₀ = 64, its released
    config's (``configs/125M/512/125M_fire_c.yml``), in the attention of ``megatron/model/transformer.py``: the
    catalogue's ``fire-dape`` with the same FIRE and DAPE weights, c and λ gives the same output on every row."""
    ref = fixture("dape")
    case = ref["fire_v1"]
    model, _ = build_model(*SMALL, *catalogue.flags("fire-dape"))
    dape = model.decoder.embed_positions.relative
    fire = dape.base
    assert fire.threshold == case["L0"].item()
    with torch.no_grad():
        for name in ("w1", "b1", "w2", "b2"):
            getattr(dape, name)[BLOCK - 1].copy_(case[name])
        fire.w1.copy_(case["fire_w1"][:, 0])  # FIRE's network: one per side, shared by the layers
        fire.b1.copy_(case["fire_b1"])
        fire.w2.copy_(case["fire_w2"].t())
        fire.b2.copy_(case["fire_b2"])
        fire.c.fill_(case["c"].item())
        fire.threshold_scale.fill_(case["L_multiplier"].item())
    for out in self_attention(model.decoder, ref, ref["x"], causal=True):
        assert_close(out, case["output"])


@pytest.mark.parametrize("case", ["none_0_0", "ntk_4_0", "yarn_4_512", "yarn_8_16"])
def test_resonance_rope_equals_sheryc_resonance_rope(case):
    """sheryc/resonance_rope @ 4a7f5a7: ``rotary_resonance.py`` ``ResonanceRotaryEmbedding``,
    ``ResonanceNTKScaledRotaryEmbedding``, and ``LlamaYaRNScaledResonanceRotaryEmbedding``: the same rounded
    wavelengths, and our rotations' real and imaginary parts equal its cos/sin tables at positions 0..63 (d = 16)."""
    ref = fixture("resonance")[case]
    kind = case.split("_")[0]
    factor, length = float(ref["factor"]), int(ref["length"])
    n, d = ref["cos"].shape[0], 2 * ref["wavelengths"].numel()
    args = argparse.Namespace(pe_rope_resonance=True, pe_rope_scaling=kind, pe_rope_scaling_factor=factor or None,
                              pe_rope_scaling_original_length=length or None)
    ours = RotaryPositionEncoding(4 * d, 4, 2, True, args)
    assert torch.equal(ours.periods, ref["wavelengths"])
    rotation, _ = ours.rotations(n, 0, torch.device("cpu"))
    assert_close(rotation.real, ref["cos"][..., :d // 2])
    assert_close(rotation.imag, ref["sin"][..., :d // 2])


@pytest.mark.parametrize("length", [37, 64])
def test_fope_equals_the_authors_fourier_embedding(length):
    """TsinghuaC3I/Fourier-Position-Embedding @ bd94b20, ``olmo/model.py``, ``FourierEmbedding`` (the released
    configs' options: floor frequencies clamped to zero and dropped, separate sin/cos bases per head): with its
    coefficients, our rotated queries equal its output at positions offset .. offset + T − 1."""
    ref = fixture("fope")[f"L{length}"]
    heads, _, d = ref["x_0"].shape[1:]
    ours = FourierPositionEncoding(d * heads, heads, 1, True, argparse.Namespace(pe_fope_train_length=length))
    with torch.no_grad():
        ours.cos_coefficients[0] = ref["cos_coef"].transpose(1, 2)
        ours.sin_coefficients[0] = ref["sin_coef"].transpose(1, 2)
    for offset in (0, 700, 5000):
        x = interleaved(ref[f"x_{offset}"])
        got, _ = ours.rotate(x, x, offset, 1)
        assert_close(half_split(got), ref[f"y_{offset}"])


@pytest.mark.parametrize("variant", ["rerope", "leaky"])
def test_rerope_equals_bojone_rerope(variant):
    """bojone/rerope @ acfe788, ``rerope_patch.py`` ``forward_with_rerope`` / ``leaky_rerope_patch.py``
    ``forward_with_leaky_rerope`` (window 4, training length 6 for the query log scaling, leaky factor 4): our
    attention probabilities equal its full pass (its q_len > 1 branch) and its step-by-step decoding (q_len == 1,
    cached unrotated keys)."""
    ref = fixture("rerope")[variant]
    _, heads, T, d = ref["q"].shape
    factor = int(ref["factor"])
    ours = RotaryPositionEncoding(heads * d, heads, 1, True, argparse.Namespace(
        pe_rerope_window=int(ref["window"]), pe_rerope_train_length=int(ref["length"]),
        pe_rerope_leaky_factor=float(factor) if factor else None))
    logits = ours.attention_logits(interleaved(ref["q"]) / math.sqrt(d), interleaved(ref["k"]), 0, 1)
    probs = (logits + torch.full((T, T), float("-inf")).triu(1)).softmax(-1)
    assert_close(probs, ref["probs"])
    assert_close(probs, ref["step_probs"])


@pytest.mark.parametrize("proportion", [0.25, 0.5, 0.75, 1.0])
def test_p_rope_equals_gemma_apply_rope(proportion):
    """google-deepmind/gemma @ 7691fd4, ``gemma/gm/math/_positional_embeddings.py``,
    ``apply_rope(rope_proportion=p)`` (JAX; fixture in JSON), half-split pairs, positions 1000..1004: our rotated
    queries equal its output."""
    with open(os.path.join(REFERENCES, "prope.json")) as f:
        ref = json.load(f)
    x = torch.tensor(ref["x"]).transpose(1, 2)  # [B, L, N, H] -> (B, heads, T, d)
    expected = torch.tensor(ref[f"p={proportion}"]).transpose(1, 2)
    heads, d = x.shape[1], x.shape[-1]
    ours = PartialRotaryPositionEncoding(heads * d, heads, 1, True, argparse.Namespace(pe_rope_proportion=proportion))
    got, _ = ours.rotate(interleaved(x), interleaved(x), ref["offset"], 1)
    assert_close(half_split(got), expected)
