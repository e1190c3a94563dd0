"""PositionAttention's three paths (fused SDPA, blockwise, explicit) compute the same attention.

The explicit path (``need_weights=True``) is the reference: the logits, probabilities and value
terms written out.  The fused and blockwise paths must give its output and its gradients, keep no
(B, H, T, S) tensor for backward, and the blockwise path's recomputation must replay dropout.
"""

import pytest
import torch

import fairseq_pe.models.attention as attention_module
from fairseq_pe import systems as catalogue
from fairseq_pe.models.attention import PositionAttention
from fairseq_pe.positional.injector import Source
from fairseq_pe.positional.pass_state import pass_scope

from helpers import build_model, random_tokens

#: the tests' sizes: a distance table and FIRE's threshold of 4 (the test's sentences go past them)
SMALL = {"fire": ["--pe-fire-threshold", "4"],
         **{name: ["--pe-relative-max-distance", "4"] for name in ("rpe-learned", "rpe-sinusoidal")}}
#: every encoding that acts in the attention (the catalogue's), and two that do not (none, the sinusoidal APE)
ENCODINGS = {name: catalogue.flags(name) + SMALL.get(name, []) for name in catalogue.GROUPS["encodings"]
             if catalogue.get(name).relative != "none" or name in ("none", "ape-sinusoidal", "floater-bias")}


def self_attention_call(model, side, x, padding, need_weights, attn_mask=None):
    """The self-attention of the side's second layer, as its layer calls it (positions of this pass set)."""
    stack = getattr(model, side)
    layer = stack.layers[1]
    return layer.self_attn(query=x, key=x, value=x, key_padding_mask=padding, need_weights=need_weights,
                           attn_mask=attn_mask)


def run_side(model, d, side, need_weights, seed=0):
    """Output and parameter gradients of one self-attention call, on a padded batch, in training mode."""
    model.train()
    src = random_tokens(d, 3, 11, seed=seed, left_pad=(0, 2, 6) if side == "encoder" else ())
    padding = src.eq(d.pad())
    stack = getattr(model, side)
    # this pass's positions (FLOATER biases, the relative encoding's rows and memo), the decoder's with a source
    position_pass = stack.embed_positions.build_pass(src, source=Source(5, 3, None) if side == "decoder" else None)
    torch.manual_seed(seed + 1)
    x = torch.randn(11, 3, stack.layers[1].self_attn.embed_dim, requires_grad=True)
    attn_mask = stack.buffered_future_mask(x) if side == "decoder" else None
    model.zero_grad()
    with pass_scope(position_pass):
        out, _ = self_attention_call(model, side, x, padding if side == "encoder" else None, need_weights, attn_mask)
    out = out.masked_fill(padding.t().unsqueeze(-1), 0) if side == "encoder" else out
    out.pow(2).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), x.grad.clone(), grads


@pytest.mark.parametrize("side", ["encoder", "decoder"])
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_fused_and_blockwise_paths_equal_the_explicit_one(name, side, monkeypatch):
    model, d = build_model(*ENCODINGS[name], "--dropout", "0", "--attention-dropout", "0")
    reference = run_side(model, d, side, need_weights=True)
    for block_elements in (1 << 22, 3 * 4 * 11 * 3):  # one block; blocks of 3 query rows
        monkeypatch.setattr(attention_module, "BLOCK_ELEMENTS", block_elements)
        out, x_grad, grads = run_side(model, d, side, need_weights=False)
        torch.testing.assert_close(out, reference[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x_grad, reference[1], rtol=1e-4, atol=1e-5)
        assert grads.keys() == reference[2].keys() and grads
        for key in grads:
            torch.testing.assert_close(grads[key], reference[2][key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("name", ["rpe-learned", "t5"])
def test_blockwise_recomputation_replays_attention_dropout(name):
    """With attention dropout, the checkpointed blocks recompute with the dropout masks of the forward
    pass: output and gradients equal those of the explicit path drawn from the same random state."""
    model, d = build_model(*ENCODINGS[name], "--dropout", "0", "--attention-dropout", "0.3")
    explicit = run_side(model, d, "encoder", need_weights=True)
    blockwise = run_side(model, d, "encoder", need_weights=False)
    without_dropout = build_model(*ENCODINGS[name], "--dropout", "0", "--attention-dropout", "0")
    plain = run_side(*without_dropout, "encoder", need_weights=False)
    assert (plain[0] - explicit[0]).abs().max() > 1e-3  # dropout did change the result
    for got, expected in zip(blockwise[:2], explicit[:2]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    for key in explicit[2]:
        torch.testing.assert_close(blockwise[2][key], explicit[2][key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_training_keeps_no_attention_matrix_per_layer(name):
    """In training, what autograd keeps for backward holds no B × H × T × S tensor per layer: at most
    one position bias (H × T × S, broadcast over the batch) shared by the layers."""
    model, d = build_model(*ENCODINGS[name], "--encoder-layers", "3")
    model.train()
    batch, length = 2, 512  # T × S is larger than any activation of the tiny model (T × B × 256)
    src = random_tokens(d, batch, length, left_pad=(0, 7))
    big = {}

    def pack(t):
        if t.numel() > length * length:
            big[t.untyped_storage().data_ptr()] = tuple(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.encoder(src, torch.tensor([length, length - 7]))
    assert len(big) <= 1, f"{len(big)} tensors larger than T × S kept for backward: {sorted(big.values())}"


def test_every_attention_module_is_position_attention():
    model, _ = build_model("--pe-relative", "alibi")
    modules = [m for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)
               or type(m).__name__.endswith("Attention")]
    assert modules and all(isinstance(m, PositionAttention) for m in modules)
    assert sum(m.uses_relative for m in modules) == len(model.encoder.layers) + len(model.decoder.layers)


@pytest.mark.parametrize("option", ["add_bias_kv", "add_zero_attn"])
def test_a_relative_encoding_refuses_extra_keys(option):
    """fairseq's add_bias_kv / add_zero_attn append a key no distance belongs to: refused, with the reason."""
    from fairseq.modules import MultiheadAttention

    model, _ = build_model("--pe-relative", "t5")
    attention = PositionAttention.adopt(MultiheadAttention(64, 4, self_attention=True, **{option: True}))
    with pytest.raises(ValueError, match="--pe-relative does not support add_bias_kv / add_zero_attn"):
        attention.attach_relative(model.encoder.embed_positions.relative, 1)
    attention.attach_relative(None, 1)  # without a relative encoding they are fairseq's own
