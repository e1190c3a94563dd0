"""Evaluation in linear memory (issue 41): the blocks path (``--pe-attention-kernel blockwise``, and ``auto`` for
long inputs) gives what today's SDPA path gives, for every encoding, with padding and causality, in float32 and
bfloat16; decoding step by step equals a full pass taken in blocks; no (B, H, T, S) tensor is built."""

import contextlib

import pytest
import torch

from fairseq_pe import systems as catalogue
from fairseq_pe.diagnostics.attention_calls import recording
from fairseq_pe.models import attention, relative_vector_blocks
from tests.helpers import ALL_ENCODINGS, build_model, random_tokens


def largest_storage_created(fn) -> int:
    """The elements of the largest storage any torch operation allocated while ``fn()`` ran (a view, such as the
    blocks path's unfold of one vector, allocates nothing)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    largest = [0]

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    largest[0] = max(largest[0], t.untyped_storage().nbytes() // t.element_size())
            return out

    with Largest():
        fn()
    return largest[0]


def outputs(model, d, src, src_lengths, prev):
    enc = model.encoder(src, src_lengths)
    out = model.decoder(prev, encoder_out=enc)[0]
    return enc["encoder_out"][0], out


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 3 or 4 rows for these tiny shapes: several blocks per call, a causal block reading fewer keys."""
    monkeypatch.setattr(attention, "EVAL_BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(attention, "EVAL_BLOCK_MIN_ROWS", 3)
    monkeypatch.setattr(attention, "EVAL_VIEW_BLOCK_ROWS", 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
@pytest.mark.parametrize("name", sorted(ALL_ENCODINGS))
def test_blocks_equal_sdpa(name, dtype, small_blocks):
    flags = ALL_ENCODINGS[name]
    reference, d = build_model(*flags, overrides={"pe_attention_kernel": "sdpa"})
    blocks, _ = build_model(*flags, overrides={"pe_attention_kernel": "blockwise"})
    blocks.load_state_dict(reference.state_dict())
    src = random_tokens(d, 3, 11, left_pad=(0, 4, 7))
    prev = random_tokens(d, 3, 10, seed=1)
    prev[2, 6:] = d.pad()  # a padded target row: its keys masked, its rows still see their past
    lengths = torch.tensor([11, 7, 4])
    with torch.no_grad(), recording(blocks) as calls:
        expected = outputs(reference.to(dtype), d, src, lengths, prev)
        got = outputs(blocks.to(dtype), d, src, lengths, prev)
    assert "blocks" in [c.path for c in calls]
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 5e-2, "atol": 5e-2}
    for e, g in zip(expected, got):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.float(), e.float(), **tolerance)


#: the encodings with query terms (the Shaw family), which evaluate in blocks on SDPA (relative_vector_blocks)
QUERY_TERMS = sorted(name for name in ALL_ENCODINGS if catalogue.get(name).query_terms)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("padding", ["left", "right", "none"])
@pytest.mark.parametrize("name", QUERY_TERMS + ["rpe-learned-untied-heads"])
def test_query_term_blocks_on_sdpa_equal_the_explicit_attention(name, padding, dtype, monkeypatch):
    """The Shaw family's blocks in evaluation, on SDPA with its log-sum-exp (the keys left and right of a block's
    band each one softmax of one distance, the band written out, merged by their shares), against every key written
    out (``explicit``): encoder and decoder, padding on the left, right or none, K = 2 and blocks of 3 rows (every
    region non-empty, and blocks at the ends), float32 and float64.  Catches a region off by one key, a key term or
    value vector of the wrong end, a share not merged, a padded region given probability."""
    flags = ["--pe-relative", "learned", "--pe-relative-untie-heads"] if name == "rpe-learned-untied-heads" \
        else ALL_ENCODINGS[name]
    flags = [*flags, "--pe-relative-max-distance", "2"]
    monkeypatch.setattr(attention, "EVAL_BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(attention, "EVAL_BLOCK_MIN_ROWS", 3)
    reference, d = build_model(*flags)
    blocks, _ = build_model(*flags, overrides={"pe_attention_kernel": "blockwise"})
    for module in reference.modules():
        if isinstance(module, attention.PositionAttention):
            module.kernel = "explicit"  # every call written out (the planner's reference)
    for model in (reference, blocks):
        model.to(dtype)
        with torch.no_grad():
            for p in model.parameters():  # relative vectors of their own size: every term counts
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(p.numel()))
    left_pad = {"left": (0, 4, 9), "right": (), "none": ()}[padding]
    src = random_tokens(d, 3, 13, left_pad=left_pad)
    prev = random_tokens(d, 3, 12, seed=1)
    if padding == "right":
        prev[2, 6:] = d.pad()
        src[1, 9:] = d.pad()
    lengths = src.ne(d.pad()).sum(1)
    sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    calls = []
    monkeypatch.setattr(relative_vector_blocks, "sdpa_with_logsumexp",
                        lambda *a: calls.append(a[1].size(2)) or sdpa(*a[:3], attn_mask=a[3], scale=1.0))
    with torch.no_grad():
        expected = outputs(reference, d, src, lengths, prev)
        got = outputs(blocks, d, src, lengths, prev)
    assert calls and max(calls) >= 5, calls  # regions on SDPA (left and right of the bands), of several keys
    # the explicit path's softmax is float32 (safe_softmax): a float64 model agrees to float32's rounding
    tolerance = {"rtol": 1e-5, "atol": 1e-5}
    for e, g in zip(expected, got):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, e, **tolerance)


def test_query_term_blocks_give_a_row_without_keys_zeros():
    """A row whose every key is padding (a source of padding only): probabilities 0 in every region, the output 0
    (as SDPA and safe_softmax give), never NaN."""
    model, _ = build_model("--pe-relative", "learned", "--pe-relative-max-distance", "1")
    relative = model.encoder.embed_positions.relative
    torch.manual_seed(0)
    heads, dim = relative.num_heads, relative.head_dim
    q, k, v = (torch.randn(2, heads, 7, dim) for _ in range(3))
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1] = True
    padding[0, :2] = True
    out = relative_vector_blocks.relative_vector_blocks(relative, 1, q, k, v, 0, False, padding,
                                                        q.new_empty(7, 2, heads, dim), elements=1, min_rows=3)
    assert torch.isfinite(out).all() and out[:, 1].abs().max() == 0 and out[:, 0].abs().min(0).values.max() > 0


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name,kernel", [(name, "blockwise") for name in ("alibi", "t5", "fire", "rpe-learned", "rope")]
                         + [("t5", "flex"), ("fire", "flex")])
def test_decoding_step_by_step_equals_blocks(name, kernel, small_blocks, eager_flex):
    """Step-by-step decoding (the explicit path, one row) gives the log-probs of one full decoder pass in blocks, or
    in FlexAttention."""
    model, d = build_model(*ALL_ENCODINGS[name], overrides={"pe_attention_kernel": kernel})
    src = random_tokens(d, 2, 9, left_pad=(0, 3))
    prev = random_tokens(d, 2, 12, seed=1)
    prev[:, 0] = d.eos()
    with torch.no_grad():
        enc = model.encoder(src, torch.tensor([9, 6]))
        full = model.get_normalized_probs(model.decoder(prev, encoder_out=enc), log_probs=True)
        state = {}
        for t in range(prev.shape[1]):
            step = model.decoder(prev[:, :t + 1], encoder_out=enc, incremental_state=state)
            torch.testing.assert_close(model.get_normalized_probs(step, log_probs=True)[:, -1], full[:, t],
                                       rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple-log", "fire", "rpe-learned"])
def test_auto_is_linear_in_evaluation(name, monkeypatch):
    """``auto`` takes the blocks path once the whole mask would be large, and builds nothing of its size then: the
    largest tensor of an encoder forward is a layer's activation (linear in T), where ``sdpa`` builds the (H, T, S)
    bias."""
    monkeypatch.setattr(attention, "AUTO_BLOCKS_ELEMENTS", 1 << 14)
    monkeypatch.setattr(attention, "EVAL_BLOCK_ELEMENTS", 1 << 12)
    length = 512
    largest = {}
    for kernel in ("sdpa", "auto"):
        model, d = build_model(*ALL_ENCODINGS[name], overrides={"pe_attention_kernel": kernel})
        src = random_tokens(d, 1, length)
        with torch.no_grad():
            largest[kernel] = largest_storage_created(lambda: model.encoder(src, torch.tensor([length])))
    heads = model.encoder.layers[0].self_attn.num_heads
    ffn = model.encoder.layers[0].fc1.out_features
    assert largest["sdpa"] >= heads * length * length // 2  # what the test would catch
    assert largest["auto"] <= length * max(ffn, 4 * model.encoder.embed_tokens.embedding_dim), largest


@pytest.fixture
def eager_flex(monkeypatch):
    """FlexAttention run eagerly (the same semantics, scores materialised): no compilation in these tests."""
    from torch.nn.attention.flex_attention import flex_attention

    from fairseq_pe.models import flex

    monkeypatch.setattr(flex, "_call_compiled",
                        lambda q, k, v, score_mod, mask, scale: flex_attention(q, k, v, score_mod=score_mod,
                                                                               block_mask=mask, scale=scale))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple-power", "fire", "rope", "none"])
def test_flex_kernel_equals_sdpa_in_a_model(name, eager_flex):
    """``--pe-attention-kernel flex`` in evaluation: every self-attention of encoder and decoder takes FlexAttention
    (the bias in the kernel, the source's left padding and the decoder's causality as block masks) and gives SDPA's
    outputs."""
    flags = ALL_ENCODINGS[name]
    reference, d = build_model(*flags, overrides={"pe_attention_kernel": "sdpa"})
    model, _ = build_model(*flags, overrides={"pe_attention_kernel": "flex"})
    model.load_state_dict(reference.state_dict())
    src = random_tokens(d, 2, 11, left_pad=(0, 4))
    prev = random_tokens(d, 2, 9, seed=1)
    lengths = torch.tensor([11, 7])
    with torch.no_grad(), recording(model) as calls:
        expected = outputs(reference, d, src, lengths, prev)
        got = outputs(model, d, src, lengths, prev)
    # self-attention; fairseq's decoder asks the cross-attention for its weights in evaluation, which its own path
    # returns
    assert [c.path for c in calls if c.role != "cross"] == ["flex"] * 4, calls
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_flex_falls_back_where_it_cannot(caplog):
    """The Shaw family's value terms need the probabilities, and the CPU has no FlexAttention backward: ``flex``
    takes auto's path there, and says why once."""
    import logging

    attention._logged_choices.clear()
    model, d = build_model(*ALL_ENCODINGS["rpe-learned"], overrides={"pe_attention_kernel": "flex"})
    src = random_tokens(d, 2, 7)
    with caplog.at_level(logging.INFO, logger="fairseq_pe.models.attention"), recording(model) as calls:
        with torch.no_grad():
            model.encoder(src, torch.tensor([7, 7]))
            model.encoder(src, torch.tensor([7, 7]))
        model.train()
        model.encoder(src, torch.tensor([7, 7]))
    assert calls and "flex" not in [c.path for c in calls]
    lines = [r.getMessage() for r in caplog.records if "--pe-attention-kernel" in r.getMessage()]
    assert any("value vectors" in line for line in lines), lines
    assert len(lines) == len(set(lines)), lines  # each choice once


def test_generate_with_blocks_translates_as_sdpa(tmp_path):
    """``fairseq-generate --model-overrides "{'pe_attention_kernel': ...}"``: a T5 model (a learned bias, padded
    sources) decodes the same hypotheses and scores with the blocks path (its encoder and the decoder's steps) as
    with the whole mask, and the log says which path ran, once."""
    import re

    from helpers import PLUGIN, cli, synthetic_data_bin

    data = synthetic_data_bin(tmp_path / "data", train_size=64, valid_size=8, test_buckets=[(3, 12)],
                              test_per_bucket=8, seed=3)
    cli("fairseq-train", data, "--user-dir", PLUGIN, "--arch", "transformer_pe_tiny", "--pe-absolute", "none",
        "--pe-relative", "t5", "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "400", "--cpu",
        "--num-workers", "0", "--max-update", "3", "--save-dir", str(tmp_path / "ckpt"), "--no-epoch-checkpoints",
        "--disable-validation")

    def generate(kernel):
        proc = cli("fairseq-generate", data, "--user-dir", PLUGIN, "--path", str(tmp_path / "ckpt" / "checkpoint_last.pt"),
                   "--gen-subset", "test", "--beam", "2", "--batch-size", "8", "--cpu", "--model-overrides",
                   f"{{'pe_attention_kernel': '{kernel}'}}")
        found = re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", proc.stdout, re.M)
        return {int(i): (float(score), text) for i, score, text in found}, proc.stdout + proc.stderr

    expected, _ = generate("sdpa")
    got, log = generate("blockwise")
    assert sorted(got) == sorted(expected) == list(range(8))
    for i, (score, text) in expected.items():
        assert got[i][1] == text and got[i][0] == pytest.approx(score, abs=1e-4)
    assert log.count("--pe-attention-kernel blockwise: blocks of query rows in evaluation (requested)") == 1, log


def test_which_path_each_kernel_takes(monkeypatch):
    """``--pe-attention-kernel``'s choices (docs/speed.md's table), with CUDA's branches simulated: ``auto`` keeps
    today's paths for small calls, takes blocks in long evaluation and FlexAttention for a learned bias's long
    training on CUDA only; ``sdpa`` never changes path."""
    from fairseq_pe.diagnostics.capabilities import as_on_cuda

    monkeypatch.setattr(attention, "AUTO_BLOCKS_ELEMENTS", 1000)
    monkeypatch.setattr(attention, "AUTO_FLEX_ELEMENTS", 1000)
    model, _ = build_model(*ALL_ENCODINGS["t5"])
    shaw, _ = build_model(*ALL_ENCODINGS["rpe-learned"])
    layer, shaw_layer = model.encoder.layers[0].self_attn, shaw.encoder.layers[0].self_attn
    t5, rpe = model.encoder.embed_positions.relative, shaw.encoder.embed_positions.relative
    q = torch.zeros(1)

    def path(attn, relative, kernel, length, training, cuda=False):
        """The planner's backend ("sdpa" named "fused", as docs/speed.md's table does), in training mode or not,
        the same with and without autograd: a checkpointed forward (no autograd) takes its recomputation's."""
        attn.kernel = kernel
        attn.train(training)
        try:
            chosen = set()
            for grad in (True, False):
                with torch.set_grad_enabled(grad), (as_on_cuda(attn) if cuda else contextlib.nullcontext()):
                    chosen.add(attn.plan(relative, 1, length, length, None, None, q.device))
        finally:
            attn.eval()
        assert len(chosen) == 1, chosen
        backend = chosen.pop()
        return "fused" if backend == "sdpa" else backend

    short, long = 10, 40  # H·T·S = 400 and 6400 elements
    assert [path(layer, t5, "auto", n, False) for n in (short, long)] == ["fused", "blocks"]
    assert [path(layer, t5, "sdpa", n, False) for n in (short, long)] == ["fused", "fused"]
    assert path(layer, t5, "blockwise", short, False) == "blocks"
    assert [path(layer, t5, "auto", n, True) for n in (short, long)] == ["blockwise", "blockwise"]  # CPU
    assert [path(layer, t5, "auto", n, True, cuda=True) for n in (short, long)] == ["fused", "flex"]
    assert path(layer, t5, "sdpa", long, True, cuda=True) == "fused"
    assert path(layer, t5, "flex", short, True) == "blockwise"  # no FlexAttention backward on the CPU
    assert path(layer, t5, "flex", short, False) == "flex"
    assert [path(shaw_layer, rpe, "auto", n, False) for n in (short, long)] == ["blockwise", "blocks"]
    rope, _ = build_model(*ALL_ENCODINGS["rope"])  # no mask of T × S to build: SDPA whole, at any length
    assert path(rope.encoder.layers[0].self_attn, rope.encoder.embed_positions.relative, "auto", long, False) \
        == "fused"
    assert path(shaw_layer, rpe, "flex", long, True, cuda=True) == "blockwise"  # value terms
