"""Unit tests of the absolute position encodings and of their wiring into transformer_pe."""

import pytest
import torch

from fairseq_pe.positional import PositionOutOfRangeError, build_position_encoding, token_positions
from fairseq_pe.positional.injector import UNLIMITED_POSITIONS
from fairseq_pe.positional.sinusoidal import sinusoid, transformer_frequencies

from helpers import assert_incremental_equals_full, build_model, random_tokens

ENCODINGS = ["none", "learned", "sinusoidal", "learnable-sinusoidal"]
WITH_VECTORS = ["learned", "sinusoidal", "learnable-sinusoidal"]


def gram(table):
    return table @ table.t()


def offset_spread(g: torch.Tensor, max_offset: int) -> float:
    """Largest spread over x of g[x, x+m], over offsets |m| <= max_offset (0 for a Toeplitz matrix)."""
    n = g.shape[0]
    spread = 0.0
    for m in range(-max_offset, max_offset + 1):
        diag = torch.diagonal(g, offset=m)
        spread = max(spread, float(diag.max() - diag.min()))
    return spread


# --- the encodings themselves ------------------------------------------------------------


def test_fixed_frequencies_follow_vaswani():
    d = 512
    omega = transformer_frequencies(d)
    assert omega.shape == (d // 2,)
    expected = torch.tensor([10000 ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float32)
    torch.testing.assert_close(omega, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", ["sinusoidal", "learnable-sinusoidal"])
def test_sinusoidal_dot_products_depend_only_on_offset(name):
    enc = build_position_encoding("absolute", name, embed_dim=64)
    if name == "learnable-sinusoidal":  # still invariant after the frequencies moved
        with torch.no_grad():
            enc.omega.mul_(torch.rand_like(enc.omega) * 2)
    table = enc(200).detach().double()
    g = gram(table)
    assert offset_spread(g, 50) < 1e-3 * float(g.diagonal().mean())
    # and the dot product is the closed form sum_i cos(omega_i * (x - y))
    omega = enc.frequencies().detach().double()
    x, y = 17, 120
    torch.testing.assert_close(g[x, y], torch.cos(omega * (x - y)).sum(), rtol=1e-5, atol=1e-5)


def test_learned_dot_products_are_not_translation_invariant():
    """The invariance check above can fail: a learned table is not Toeplitz."""
    enc = build_position_encoding("absolute", "learned", embed_dim=64, max_positions=200)
    g = gram(enc(200).detach().double())
    assert offset_spread(g, 50) > 0.5


def test_learnable_frequencies_start_at_fixed_values_and_get_gradients():
    fixed = build_position_encoding("absolute", "sinusoidal", embed_dim=64)
    learn = build_position_encoding("absolute", "learnable-sinusoidal", embed_dim=64)
    torch.testing.assert_close(learn.omega.detach(), fixed.omega)
    assert [n for n, _ in fixed.named_parameters()] == []

    model, d = build_model("--pe-absolute", "learnable-sinusoidal")
    model.train()
    src = random_tokens(d, 2, 9)
    prev = random_tokens(d, 2, 7, seed=1)
    out, _ = model(src, torch.tensor([9, 9]), prev)
    out.float().pow(2).mean().backward()
    for side in (model.encoder, model.decoder):
        grad = side.embed_positions.absolute.omega.grad
        assert grad is not None and grad.abs().sum() > 0


def test_sinusoidal_has_no_length_limit():
    enc = build_position_encoding("absolute", "sinusoidal", embed_dim=32, max_positions=16)
    assert enc.max_positions is None
    table = enc(5000)
    assert table.shape == (5000, 32) and torch.isfinite(table).all()
    model, _ = build_model("--pe-absolute", "sinusoidal", "--max-source-positions", "16")
    assert model.max_positions() == (UNLIMITED_POSITIONS, UNLIMITED_POSITIONS)


def test_odd_dimension_gets_a_zero_column():
    out = sinusoid(torch.arange(5), transformer_frequencies(7), 7)
    assert out.shape == (5, 7) and torch.all(out[:, -1] == 0)


# --- per-block injection (--pe-all-blocks) ---------------------------------------------------


def test_per_block_sinusoid_is_floater_eq7():
    enc = build_position_encoding("absolute", "sinusoidal", embed_dim=16, num_blocks=3, all_blocks=True)
    omega = transformer_frequencies(16)
    for n in (1, 2, 3):
        expected = sinusoid(torch.arange(10), omega, 16) + sinusoid(torch.tensor([float(n)]), omega, 16)
        torch.testing.assert_close(enc(10, block=n), expected)


@pytest.mark.parametrize("name", WITH_VECTORS)
def test_per_block_vectors_differ_per_block(name):
    model, _ = build_model("--pe-absolute", name, "--pe-all-blocks", "--encoder-layers", "3")
    enc = model.encoder.embed_positions.absolute
    tables = [enc(12, block=n).detach() for n in (1, 2, 3)]
    for a in range(3):
        for b in range(a + 1, 3):
            assert (tables[a] - tables[b]).abs().max() > 1e-3, (a + 1, b + 1)
    # without --pe-all-blocks every block would get the input block's vectors, and only block 1 gets them
    single, _ = build_model("--pe-absolute", name, "--encoder-layers", "3")
    assert not single.encoder.embed_positions.all_blocks


@pytest.mark.parametrize("name", WITH_VECTORS)
def test_all_blocks_changes_the_encoder_output(name):
    """The deeper blocks really receive vectors: same weights, with and without --pe-all-blocks."""
    every, d = build_model("--pe-absolute", name, "--pe-all-blocks")
    first, _ = build_model("--pe-absolute", name)
    state = {k: v for k, v in every.state_dict().items()}
    if name == "learned":  # the input table of the single-block model is block 1's table
        for side in ("encoder", "decoder"):
            state[f"{side}.embed_positions.absolute.weight"] = state[f"{side}.embed_positions.absolute.weight"][:1]
    first.load_state_dict(state)
    src = random_tokens(d, 2, 8)
    a = every.encoder(src, torch.tensor([8, 8]))["encoder_out"][0]
    b = first.encoder(src, torch.tensor([8, 8]))["encoder_out"][0]
    assert (a - b).abs().max() > 1e-3


# --- model-level properties ------------------------------------------------------------------


def test_no_position_encoding_makes_the_encoder_permutation_equivariant():
    model, d = build_model("--pe-absolute", "none")
    src = random_tokens(d, 2, 10)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    out = model.encoder(src, torch.tensor([10, 10]))["encoder_out"][0]
    out_perm = model.encoder(src[:, perm], torch.tensor([10, 10]))["encoder_out"][0]
    torch.testing.assert_close(out_perm, out[perm], rtol=1e-5, atol=1e-5)


def test_sinusoidal_encoder_is_not_permutation_equivariant():
    model, d = build_model("--pe-absolute", "sinusoidal")
    src = random_tokens(d, 2, 10)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    out = model.encoder(src, torch.tensor([10, 10]))["encoder_out"][0]
    out_perm = model.encoder(src[:, perm], torch.tensor([10, 10]))["encoder_out"][0]
    assert (out_perm - out[perm]).abs().max() > 1e-2


def test_positions_skip_left_padding():
    tokens = torch.tensor([[1, 1, 5, 6, 7], [5, 6, 7, 8, 9]])
    assert token_positions(tokens, padding_idx=1).tolist() == [[-1, -1, 0, 1, 2], [0, 1, 2, 3, 4]]


@pytest.mark.parametrize("name", ENCODINGS)
def test_left_padded_source_encodes_like_the_unpadded_one(name):
    model, d = build_model("--pe-absolute", name, "--pe-all-blocks" if name != "none" else "--dropout=0.1")
    src = random_tokens(d, 2, 9, left_pad=(0, 3))
    out = model.encoder(src, torch.tensor([9, 6]))["encoder_out"][0]
    alone = model.encoder(src[1:, 3:], torch.tensor([6]))["encoder_out"][0]
    torch.testing.assert_close(out[3:, 1], alone[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("all_blocks", [False, True])
@pytest.mark.parametrize("name", ENCODINGS)
def test_incremental_decoding_equals_full_forward(name, all_blocks):
    if all_blocks and name == "none":
        pytest.skip("--pe-all-blocks needs an absolute encoding")
    flags = ["--pe-absolute", name] + (["--pe-all-blocks"] if all_blocks else [])
    model, d = build_model(*flags)
    assert_incremental_equals_full(model, d)


@pytest.mark.parametrize("side", ["source", "target"])
def test_learned_beyond_its_table_names_the_flag(side):
    model, d = build_model("--pe-absolute", "learned", "--max-source-positions", "8",
                           "--max-target-positions", "8")
    assert model.max_positions() == (8, 8)
    long = random_tokens(d, 1, 10)
    short = random_tokens(d, 1, 5)
    with pytest.raises(PositionOutOfRangeError, match=f"--max-{side}-positions 8"):
        if side == "source":
            model.encoder(long, torch.tensor([10]))
        else:
            model.decoder(long, encoder_out=model.encoder(short, torch.tensor([5])))


@pytest.mark.parametrize("flag,use", [("--encoder-learned-pos", "--pe-absolute learned"),
                                      ("--no-token-positional-embeddings", "--pe-absolute none")])
def test_fairseq_position_flags_are_refused(flag, use):
    with pytest.raises(ValueError, match=use):
        build_model(flag)


def test_all_blocks_without_an_encoding_is_refused():
    with pytest.raises(ValueError, match="--pe-all-blocks"):
        build_model("--pe-absolute", "none", "--pe-all-blocks")


def test_half_precision_keeps_the_dtype():
    model, d = build_model("--pe-absolute", "none")
    model.half()
    src = random_tokens(d, 1, 5)
    assert model.encoder.embed_positions(src).dtype == torch.float16


@pytest.mark.parametrize("dim", [8, 65, 512])
def test_fairseq_sinusoidal_equals_fairseqs_own_module(dim):
    """--pe-absolute sinusoidal-fairseq: fairseq's SinusoidalPositionalEmbedding rows, bit for bit."""
    from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding

    from fairseq_pe.positional import build_position_encoding

    padding_idx = 1
    ours = build_position_encoding("absolute", "sinusoidal-fairseq", embed_dim=dim, padding_idx=padding_idx)
    theirs = SinusoidalPositionalEmbedding.get_embedding(300, dim, padding_idx)[padding_idx + 1:]
    assert torch.equal(ours(298), theirs)
