"""FlexAttention path (fairseq_pe/models/flex.py): every encoding's score_mod evaluated densely equals its
position_bias, values and parameter gradients; flex_attention_forward (eager; one compiled CPU forward) equals SDPA
with the dense bias and the masks, with padding, causality, a chunk of rows, float32 and bf16; flex_supported's
reasons.  The CPU has no FlexAttention backward: the kernel's gradients are fairseq-pe-gpu-check's ``flex`` check."""

import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fairseq_pe.models import flex
from fairseq_pe.models.flex import bucket, dense_score_bias, flex_attention_forward, flex_supported
from fairseq_pe.positional import build_position_encoding
from fairseq_pe.positional.pass_state import PassMemo, RelativeRows

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # eager flex_attention warns that it is not compiled

HEADS = 4
BIASED = ["alibi", "t5", "kerple-log", "kerple-power", "sandwich", "fire"]


@pytest.fixture
def small_blocks(monkeypatch):
    """Eager FlexAttention materialises the padded (B, H, T, S) scores: blocks (and buckets) of 16 instead of 128
    keep the tests' shapes small (lengths are still rounded up, the extra keys masked and rows dropped)."""
    monkeypatch.setattr(flex, "BLOCK", 16)


def encoding(name, causal, heads=HEADS, seed=0):
    """``name`` a registered relative encoding, or "fire:leaky-relu" (FIRE with --pe-fire-activation leaky-relu)."""
    torch.manual_seed(seed)
    name, _, activation = name.partition(":")
    enc = build_position_encoding("relative", name, embed_dim=8 * heads, num_heads=heads, num_blocks=2,
                                  causal=causal, args=SimpleNamespace(pe_fire_threshold=3.0, pe_t5_max_distance=8,
                                                                      pe_t5_num_buckets=8,
                                                                      pe_fire_activation=activation or None))
    with torch.no_grad():  # trained-looking parameters, not the initial ones (KERPLE's r₂ away from its bounds)
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return enc


def left_padded_positions(lengths, width):
    """(B, width) positions 0 .. n−1 right-aligned, −1 at the (left) padding."""
    rows = [[-1] * (width - n) + list(range(n)) for n in lengths]
    return torch.tensor(rows)


def random_positions(batch, width, bound, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(bound, generator=g)[:width].sort().values for _ in range(batch)])


CASES = [(name, causal, None) for name in BIASED for causal in (False, True)] + [
    ("alibi", False, "random"), ("t5", True, "random"), ("t5", False, "random"), ("fire", False, "left-padded"),
    ("fire", True, "random"), ("fire:leaky-relu", True, None), ("fire:leaky-relu", False, "left-padded")]


@pytest.mark.parametrize("name,causal,positions", CASES, ids=lambda x: str(x))
@pytest.mark.parametrize("chunk", [False, True], ids=["rows", "chunk"])
def test_dense_score_mod_equals_position_bias(name, causal, positions, chunk):
    """score_mod evaluated on index grids == position_bias (broadcast), and the gradients of one scalar function
    of either w.r.t. the encoding's parameters are equal."""
    batch, src_len = 2, 11
    tgt_len, offset = (4, 5) if chunk else (src_len, 0)
    enc = encoding(name, causal)
    rows = None
    if positions == "random":
        rows = RelativeRows(random_positions(batch, src_len, 40), 40, PassMemo())
    elif positions == "left-padded":
        rows = RelativeRows(left_padded_positions([11, 7], src_len), src_len, PassMemo())
    reference = enc.position_bias(tgt_len, src_len, offset, 1, rows=rows)
    reference = reference.expand(batch, HEADS, tgt_len, src_len)
    mod = enc.score_mod(tgt_len, src_len, offset, 1, rows=rows)
    dense = dense_score_bias(mod, batch, HEADS, tgt_len, src_len)
    # what the attention sees: padded keys and (decoder) future keys are masked, whatever the bias there
    visible = torch.ones(batch, 1, tgt_len, src_len, dtype=torch.bool)
    if causal:
        visible &= (torch.arange(src_len).view(1, -1) <= torch.arange(tgt_len).view(-1, 1) + offset)
    if rows is not None:
        visible &= rows.positions.ge(0).view(batch, 1, 1, src_len)
    visible = visible.expand_as(dense)
    torch.testing.assert_close(dense[visible], reference[visible].float(), rtol=1e-5, atol=1e-5)
    weights = torch.randn(batch, HEADS, tgt_len, src_len) * visible
    params = [p for p in enc.parameters() if p.requires_grad]
    if params:
        got = torch.autograd.grad((dense * weights).sum(), params, allow_unused=True)
        want = torch.autograd.grad((reference * weights).sum(), params, allow_unused=True)
        assert sum(w.abs().sum() for w in want) > 0
        for p, g, w in zip(params, got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def reference_attention(enc, rows, q, k, v, scale, offset, causal, padding):
    """SDPA with the dense bias + the causal and padding masks (float32 math), in q's dtype."""
    batch, heads, tgt_len, _ = q.shape
    src_len = k.size(2)
    mask = torch.zeros(batch, heads, tgt_len, src_len)
    if enc is not None:
        mask = mask + enc.position_bias(tgt_len, src_len, offset, 1, rows=rows).float()
    if causal:
        future = torch.arange(src_len).view(1, -1) > torch.arange(tgt_len).view(-1, 1) + offset
        mask = mask.masked_fill(future, float("-inf"))
    if padding is not None:
        mask = mask.masked_fill(padding.view(batch, 1, 1, src_len), float("-inf"))
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale)
    return out.to(q.dtype)


TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=2e-5), torch.bfloat16: dict(rtol=2e-2, atol=3e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
@pytest.mark.parametrize("name", BIASED + ["none"])
def test_eager_flex_equals_sdpa(name, dtype, small_blocks):
    """flex_attention_forward (eager) == SDPA with the dense bias and the masks: encoder with left padding, decoder
    (causal) with right padding, and a chunk of decoder rows (query_offset > 0); the lengths are not multiples of
    the kernel's block (the bucket's extra keys are masked, its extra rows dropped)."""
    torch.manual_seed(0)
    batch, src_len, d = 2, 37, 8
    scale = d ** -0.5
    left = torch.arange(src_len).view(1, -1) < torch.tensor([[0], [9]])  # row 1: 9 padding tokens on the left
    right = torch.arange(src_len).view(1, -1) >= torch.tensor([[src_len], [30]])
    for causal, padding, tgt_len, offset in [(False, left, src_len, 0), (True, right, src_len, 0),
                                             (True, None, 6, 20)]:
        enc = None if name == "none" else encoding(name, causal)
        rows = None
        if name == "fire" and padding is not None and not causal:  # FIRE reads the rows' positions when padded
            rows = RelativeRows(left_padded_positions([src_len, src_len - 9], src_len), src_len, PassMemo())
        q = torch.randn(batch, HEADS, tgt_len, d).to(dtype)
        k, v = (torch.randn(batch, HEADS, src_len, d).to(dtype) for _ in range(2))
        with torch.no_grad():
            got = flex_attention_forward(enc, rows, 1, q, k, v, scale=scale, query_offset=offset, causal=causal,
                                         key_padding_mask=padding, dropout_p=0.0, compiled=False)
            want = reference_attention(enc, rows, q, k, v, scale, offset, causal, padding)
        assert got.shape == want.shape and got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), **TOLERANCE[dtype],
                                   msg=lambda m: f"causal={causal} offset={offset}: {m}")


def test_eager_flex_randomised_positions(small_blocks):
    """Rows with positions of their own (randomised): the score_mod gathers pos[b, kv] − pos[b, q] into the
    distance vector over −bound .. bound; flex == SDPA with position_bias.  9 rows: the batch is rounded up to its
    bucket (10), the extra row's positions padded."""
    torch.manual_seed(0)
    batch, src_len, d = 9, 20, 8
    for name in ("alibi", "t5"):
        enc = encoding(name, causal=False)
        rows = RelativeRows(random_positions(batch, src_len, 300), 300, PassMemo())
        q, k, v = (torch.randn(batch, HEADS, src_len, d) for _ in range(3))
        with torch.no_grad():
            got = flex_attention_forward(enc, rows, 1, q, k, v, scale=d ** -0.5, query_offset=0, causal=False,
                                         key_padding_mask=None, compiled=False)
            want = reference_attention(enc, rows, q, k, v, d ** -0.5, 0, False, None)
        torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])


def test_block_mask_skips_masked_blocks():
    """The block mask is built per block: a causal 384 × 384 mask has 1 + 2 + 3 visible key blocks of which the
    3 on the diagonal are partial; in a row whose first 200 keys are padding, key block 0 is skipped and block 1
    (partly padding) is partial."""
    padding = torch.zeros(2, 384, dtype=torch.bool)
    padding[1, :200] = True
    mask = flex.block_mask(padding, 2, 384, 384, 0, True, "cpu")
    partial, full = mask.kv_num_blocks, mask.full_kv_num_blocks
    assert partial[0, 0].tolist() == [1, 1, 1] and full[0, 0].tolist() == [0, 1, 2]
    assert partial[1, 0].tolist() == [0, 1, 2] and full[1, 0].tolist() == [0, 0, 0]
    # element by element: the visited blocks with mask_mod applied are the causal and padding masks, and mask_mod
    # holds on every element of a full block (where the kernel does not apply it)
    positions = torch.arange(384)
    want = (positions.view(1, -1) <= positions.view(-1, 1)) & ~padding.view(2, 1, 384)
    grid = (torch.arange(2).view(-1, 1, 1), 0, positions.view(1, -1, 1), positions.view(1, 1, -1))
    visited = mask.to_dense()[:, 0].repeat_interleave(128, 1).repeat_interleave(128, 2).bool()
    assert torch.equal(visited & mask.mask_mod(*grid), want)
    full_blocks = torch.zeros(2, 3, 3, dtype=torch.bool)
    for b in range(2):
        for row in range(3):
            full_blocks[b, row, mask.full_kv_indices[b, 0, row, :mask.full_kv_num_blocks[b, 0, row]]] = True
    full_blocks = full_blocks.repeat_interleave(128, 1).repeat_interleave(128, 2)
    assert want[full_blocks].all() and full_blocks.any()


def test_buckets():
    assert [bucket(n) for n in (1, 128, 129, 1000, 1025, 2047, 2049, 16384, 16385)] == \
        [128, 128, 256, 1024, 1152, 2048, 2304, 16384, 18432]
    assert [flex.batch_bucket(n) for n in (1, 3, 4, 7, 8, 9, 11, 16, 17, 33)] == [1, 3, 4, 7, 8, 10, 12, 16, 20, 40]


def test_compiled_cpu_forward_equals_eager():
    """One compiled CPU forward (ALiBi, one shape) equals the eager one (and SDPA's)."""
    torch.manual_seed(0)
    enc = encoding("alibi", causal=True)
    batch, src_len, d = 2, 100, 16
    q, k, v = (torch.randn(batch, HEADS, src_len, d) for _ in range(3))
    padding = torch.arange(src_len).view(1, -1) >= torch.tensor([[src_len], [70]])
    kwargs = dict(scale=d ** -0.5, query_offset=0, causal=True, key_padding_mask=padding)
    with torch.no_grad():
        compiled = flex_attention_forward(enc, None, 1, q, k, v, compiled=True, **kwargs)
        eager = flex_attention_forward(enc, None, 1, q, k, v, compiled=False, **kwargs)
        want = reference_attention(enc, None, q, k, v, d ** -0.5, 0, True, padding)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled, want, rtol=1e-5, atol=1e-5)


def test_flex_supported_reasons(monkeypatch):
    for name in ("learned", "sinusoidal", "learnable-sinusoidal"):
        reason = flex_supported(encoding(name, causal=False), "cuda")
        assert reason is not None and "value" in reason and name in reason
    with torch.no_grad():
        for name in BIASED + ["rope"]:
            assert flex_supported(encoding(name, causal=True), "cpu") is None, name
        assert flex_supported(None, "cpu") is None
        assert "dropout" in flex_supported(None, "cuda", dropout_p=0.1)
    # training is the module's mode, never the grad mode (a checkpointed forward runs without autograd)
    assert "backward on CPU" in flex_supported(encoding("alibi", causal=False), "cpu", training=True)
    assert flex_supported(encoding("alibi", causal=False), "cpu") is None  # grad enabled, evaluation
    assert "float64" in flex_supported(encoding("alibi", causal=False), "cpu", dtype=torch.float64)
    assert flex_supported(encoding("t5", causal=False), "cuda") is None
    monkeypatch.setattr(flex, "flex_attention", None)
    assert "torch without flex_attention" in flex_supported(encoding("alibi", causal=False), "cuda")


def test_shaw_key_term_score_mod():
    """The Shaw family's key term as a per-distance logit table: dense score_mod == logit_terms (gradients to
    a^K included); the family itself is refused by flex_supported (value vectors)."""
    enc = encoding("learned", causal=False)
    batch, tgt_len, src_len, offset = 2, 5, 9, 3
    q = torch.randn(batch, HEADS, tgt_len, enc.head_dim)
    want = enc.logit_terms(q.reshape(batch * HEADS, tgt_len, -1), tgt_len, src_len, offset, 1)
    got = dense_score_bias(enc.score_mod(tgt_len, src_len, offset, 1, q=q), batch, HEADS, tgt_len, src_len)
    torch.testing.assert_close(got, want.expand_as(got))
    weights = torch.randn_like(got)
    g1 = torch.autograd.grad((got * weights).sum(), enc.key_vectors)[0]
    g2 = torch.autograd.grad((want.expand_as(got) * weights).sum(), enc.key_vectors)[0]
    torch.testing.assert_close(g1, g2)
