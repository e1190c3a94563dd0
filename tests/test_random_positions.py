"""Randomised positions (issue 18, Ruoss et al. 2023): the sampling, every family's bias/rotation from the rows'
own positions against its usual computation, training against evaluation, decoding, limits and refusals."""

from types import SimpleNamespace

import pytest
import torch

from fairseq_pe import systems as catalogue
from fairseq_pe.errors import UserError
from fairseq_pe.positional import build_position_encoding
from fairseq_pe.positional.pass_state import RelativeRows
from fairseq_pe.positional.random_positions import sample_positions

from helpers import ALL_ENCODINGS, RANDOMISABLE, assert_incremental_equals_full, build_model, random_tokens
from passes import recorded_passes


def test_samples_are_sorted_distinct_in_range_and_skip_padding():
    torch.manual_seed(0)
    positions = torch.tensor([[0, 1, 2, 3, 4], [-1, -1, 0, 1, 2], [0, 1, 2, -1, -1]])
    for _ in range(50):
        s = sample_positions(positions, 12)
        assert torch.equal(s.lt(0), positions.lt(0))
        for row in s:
            real = row[row >= 0]
            assert bool((real[1:] > real[:-1]).all()) and int(real.max()) < 12
    # n = L: every position, in order
    assert sample_positions(torch.arange(6).unsqueeze(0), 6).tolist() == [list(range(6))]
    with pytest.raises(UserError, match="--pe-random-positions 4: a sequence of 5 tokens"):
        sample_positions(positions, 4)


def test_samples_are_uniform():
    """Each of L positions is equally likely, for rows of every length (a row's subset is its own, not the first n
    of a longer row's)."""
    torch.manual_seed(1)
    counts = torch.zeros(10)
    positions = torch.tensor([[0, 1, 2], [0, -1, -1]]).repeat(4000, 1)
    s = sample_positions(positions, 10)
    short = s[1::2, 0]
    counts.scatter_add_(0, short, torch.ones_like(short, dtype=torch.float))
    assert float((counts / counts.sum() - 0.1).abs().max()) < 0.02  # 4000 draws: sd 0.005
    first = s[0::2, 0].float().mean()
    assert abs(float(first) - 1.75) < 0.15  # the smallest of 3 of 1..10 has E = (10 + 1)/(3 + 1) = 2.75


FAMILIES = ["alibi", "t5", "kerple-log", "kerple-power", "sandwich", "fire", "learned", "sinusoidal",
            "learnable-sinusoidal", "rope", "xpos"]


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("causal", [False, True])
def test_rows_positions_equal_to_the_indices_give_the_usual_terms(name, causal):
    torch.manual_seed(0)
    enc = build_position_encoding("relative", name, embed_dim=16, num_heads=2, num_blocks=2, causal=causal,
                                  args=SimpleNamespace(pe_fire_threshold=3.0))
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    probs = torch.rand(4, 5, 5)

    def terms(positions=None, bound=None):  # a pass whose rows have these positions (None: the indices)
        rows = RelativeRows(positions, bound)
        rq, rk = enc.rotate(q, k, 0, 1, rows=rows)
        bias = enc.position_bias(5, 5, 0, 1, rows=rows)
        logits = enc.logit_terms(q.reshape(4, 5, 8), 5, 5, 0, 1, rows=rows)
        values = enc.value_terms(probs, 5, 5, 0, 1, rows=rows)
        return rq @ rk.transpose(-1, -2), bias, logits, values

    usual = terms()
    rows = terms(torch.arange(5).repeat(2, 1), 5)
    for a, b in zip(usual, rows):
        if a is None:
            assert b is None
            continue
        torch.testing.assert_close(b.expand(2, *a.shape[-3:]) if b.dim() == 4 else b,
                                   a.expand(2, *a.shape[-3:]) if a.dim() == 3 and b.dim() == 4 else a)
    # shifted positions: distance-only families do not change; a gap changes them
    shifted = terms(torch.arange(5).repeat(2, 1) + 7, 12)
    gapped = terms(torch.tensor([[0, 1, 2, 3, 4], [0, 3, 9, 10, 30]]), 31)
    if name != "fire":  # FIRE's normaliser takes the positions themselves
        for a, b in zip(rows, shifted):
            if a is not None:
                torch.testing.assert_close(a, b)
    changed = [g is not None and not torch.allclose(g[1], r[1]) for g, r in zip(gapped, rows)]
    assert any(changed) and not any(g is not None and not torch.allclose(g[0], r[0]) for g, r in zip(gapped, rows))


@pytest.mark.parametrize("flags", [catalogue.flags(name) for name in ("ape-sinusoidal", "ape-learned", "alibi", "rope",
                                                                     "rpe-learned")]
                         + [catalogue.flags("fire") + ["--pe-fire-threshold", "4"]])
def test_training_samples_and_decoding_stays_exact(flags):
    model, d = build_model(*flags, "--pe-random-positions", "64")
    enc_injector, dec_injector = model.encoder.embed_positions, model.decoder.embed_positions
    assert enc_injector.max_positions == 64 and dec_injector.max_positions == 64
    src, prev = random_tokens(d, 2, 9, left_pad=(0, 3)), random_tokens(d, 2, 7, seed=1)
    model.train()
    torch.manual_seed(0)
    with recorded_passes(enc_injector) as encoded, recorded_passes(dec_injector) as decoded:
        out1 = model(src, torch.tensor([9, 6]), prev)[0]
        out2 = model(src, torch.tensor([9, 6]), prev)[0]
    first, second = encoded[0].positions, encoded[1].positions
    assert not torch.equal(first, second) and not torch.allclose(out1, out2)
    assert int(second.max()) < 64 and int(decoded[1].positions.max()) >= 7 - 1
    out1.float().pow(2).mean().backward()
    model.eval()
    # evaluation: the decoder takes 0 .. n−1, so step-by-step decoding equals the full pass (the encoder samples)
    with torch.no_grad(), recorded_passes(dec_injector) as decoded:
        model(src, torch.tensor([9, 6]), prev)
        assert decoded[-1].positions.tolist() == [list(range(7))] * 2
        assert_incremental_equals_full(model, d)


def test_bad_uses_are_refused_naming_the_flag():
    with pytest.raises(UserError, match="not supported with FLOATER"):
        build_model("--pe-absolute", "floater", "--pe-random-positions", "64")
    with pytest.raises(UserError, match="no effect without a position encoding"):
        build_model("--pe-absolute", "none", "--pe-random-positions", "64")
    with pytest.raises(UserError, match="--pe-random-positions 300 .* set --max-source-positions 300"):
        build_model("--pe-absolute", "learned", "--max-source-positions", "256", "--pe-random-positions", "300")
    for value in ("0", str(1 << 40)):  # 2^40 passed the check, then allocated batch × L at the first step
        with pytest.raises(UserError, match=r"--pe-random-positions must be from 1 .* to 16,777,216 \(2\^24: past it "
                                            r"float32.*got (0|1,099,511,627,776)"):
            build_model("--pe-random-positions", value)


def test_evaluation_gives_each_sentence_its_own_fixed_draw():
    """In evaluation a source sentence's positions depend on its tokens only: not on the batch, its padding or the
    global seed (fairseq-generate's scores do not change with --batch-size); different sentences differ."""
    model, d = build_model("--pe-absolute", "none", "--pe-relative", "alibi", "--pe-random-positions", "50")
    model.eval()
    injector = model.encoder.embed_positions
    src = random_tokens(d, 3, 9, left_pad=(0, 3, 0))
    src[2] = src[0]
    torch.manual_seed(0)
    with torch.no_grad(), recorded_passes(injector) as passes:
        batch = model.encoder(src, torch.tensor([9, 6, 9]))["encoder_out"][0]
        positions = passes[-1].positions
        torch.manual_seed(123)
        alone = model.encoder(src[1:2, 3:], torch.tensor([6]))["encoder_out"][0]
    assert passes[-1].positions[0].tolist() == positions[1, 3:].tolist()
    assert torch.equal(positions[0], positions[2]) and not torch.equal(positions[0, 3:], positions[1, 3:])
    assert positions[1, :3].tolist() == [-1, -1, -1] and int(positions.max()) < 50
    torch.testing.assert_close(alone[:, 0], batch[3:, 1], rtol=1e-5, atol=1e-5)


def _reference_keys(sentence, limit):
    """``_keys_seeded_by_tokens`` of one sentence (its real tokens) in Python's integers: MurmurHash3's fmix32."""
    def fmix32(h):
        h ^= h >> 16
        h = h * 0x85EBCA6B & 0xFFFFFFFF
        h ^= h >> 13
        h = h * 0xC2B2AE35 & 0xFFFFFFFF
        return h ^ (h >> 16)

    total = sum(fmix32((token + fmix32((i + 1) * 0x9E3779B9 & 0xFFFFFFFF)) & 0xFFFFFFFF)
                for i, token in enumerate(sentence))
    sentence_hash = fmix32((total + len(sentence) * 0x9E3779B9) & 0xFFFFFFFF)
    return [fmix32(fmix32((c + 1) * 0x9E3779B9 & 0xFFFFFFFF) ^ sentence_hash) for c in range(limit)]


def test_evaluation_draws_are_exact_integer_functions_of_the_sentence():
    """The evaluation keys are computed on the tokens' device in int64 without overflow: bit for bit the reference
    in Python's integers (so the CPU and CUDA give the same draws), distinct within a row (``topk`` has no ties to
    break differently on another device), and the same for a sentence whatever its batch, padding side, width or
    token dtype."""
    from fairseq_pe.positional.injector import token_positions
    from fairseq_pe.positional.random_positions import _keys_seeded_by_tokens

    pad, limit = 1, 40
    g = torch.Generator().manual_seed(0)
    sentences = [torch.randint(4, 1 << 31, (n,), generator=g) for n in (1, 5, 12, 30)] + [torch.tensor([4, 5, 6])]
    tokens = torch.full((len(sentences), 30), pad)
    for row, sentence in enumerate(sentences):
        tokens[row, 30 - len(sentence):] = sentence  # left-padded, as fairseq's source
    keys = _keys_seeded_by_tokens(tokens, token_positions(tokens, pad), limit)
    assert keys.tolist() == [_reference_keys(sentence.tolist(), limit) for sentence in sentences]
    assert all(len(set(row)) == limit for row in keys.tolist())

    def draws(batch):
        return sample_positions(token_positions(batch, pad), limit, batch)

    left = draws(tokens)
    right = torch.full((len(sentences), 34), pad)  # right-padded, wider, in another order
    for row, sentence in enumerate(reversed(sentences)):
        right[row, :len(sentence)] = sentence
    for row, sentence in enumerate(reversed(sentences)):
        n = len(sentence)
        expected = left[len(sentences) - 1 - row, 30 - n:]
        assert torch.equal(draws(right)[row, :n], expected)
        assert torch.equal(draws(right[row:row + 1, :n].int())[0], expected)
    shuffled = torch.tensor([[6, 5, 4]])  # the same tokens in another order: another sentence
    assert not torch.equal(draws(shuffled), left[-1:, -3:])


def test_evaluation_draws_are_uniform_over_sentences():
    """Over 20,000 distinct sentences of 3 tokens, each of L = 16 positions is drawn as often (χ² with 15 degrees
    of freedom below 37.7, its 0.1% point), every one of the C(16, 3) = 560 subsets occurs, and the smallest
    position averages (L + 1)/(n + 1) − 1 = 3.25, as training's draws."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randperm(1 << 20, generator=g)[:20000].view(-1, 1) * 3 + torch.tensor([4, 5, 6])
    positions = torch.arange(3).repeat(len(tokens), 1)
    draws = sample_positions(positions, 16, tokens)
    counts = torch.bincount(draws.flatten(), minlength=16).double()
    expected = counts.sum() / 16
    assert float(((counts - expected) ** 2 / expected).sum()) < 37.7
    assert len(set(map(tuple, draws.tolist()))) == 560
    assert abs(float(draws[:, 0].double().mean()) - 3.25) < 0.05  # sd of the mean ≈ 0.02


def test_spaced_evaluation_positions_are_trainings_mean_draws_for_the_sources_length():
    """The reference: training's draws for a target of m tokens.  The k-th smallest of m uniform distinct draws
    from [0, L) averages (L+1)·k/(m+1) − 1; ``spaced_positions`` gives its floor for t < m, then steps of 1."""
    from fairseq_pe.positional.random_positions import spaced_positions

    torch.manual_seed(0)
    m, limit = 6, 40
    draws = sample_positions(torch.arange(m).unsqueeze(0).repeat(20000, 1), limit).float().mean(0)
    spaced = spaced_positions(torch.arange(m + 3).unsqueeze(0), torch.tensor([m]), limit)[0]
    assert (spaced[:m].float() - draws).abs().max() < 1.0  # within the floor (sd of the mean ≈ 0.04)
    assert spaced[:m].tolist() == [(t + 1) * (limit + 1) // (m + 1) - 1 for t in range(m)]
    assert spaced[m:].tolist() == [spaced[m - 1] + 1, spaced[m - 1] + 2, spaced[m - 1] + 3]
    # every row its own source length; padding stays −1; m = L gives 0..L−1; at most L−1 within the source's length
    positions = torch.tensor([[0, 1, 2, 3], [-1, 0, 1, 2], [0, 1, 2, 3]])
    rows = spaced_positions(positions, torch.tensor([2, 3, 4]), 4)
    assert rows.tolist() == [[0, 2, 3, 4], [-1, 0, 1, 2], [0, 1, 2, 3]]


@pytest.mark.parametrize("name", RANDOMISABLE)
def test_spaced_evaluation_decodes_step_by_step_as_the_full_pass(name):
    """--pe-random-eval-decoder spaced, set as fairseq-generate's --model-overrides sets it: the decoder's positions
    in evaluation are the spaced ones of each row's source length, the same in step-by-step decoding as in the full
    pass; training still draws; the encoder keeps its own fixed draw."""
    from fairseq_pe.positional.random_positions import spaced_positions

    flags = ALL_ENCODINGS[name]
    model, d = build_model(*flags, "--pe-random-positions", "64", overrides={"pe_random_eval_decoder": "spaced"})
    default, _ = build_model(*flags, "--pe-random-positions", "64")
    default.load_state_dict(model.state_dict())
    src, prev = random_tokens(d, 2, 9, left_pad=(0, 3)), random_tokens(d, 2, 7, seed=1)
    injector = model.decoder.embed_positions
    with torch.no_grad():
        with recorded_passes(injector) as passes:
            out = model(src, torch.tensor([9, 6]), prev)[0]
        expected = spaced_positions(torch.arange(7).unsqueeze(0).repeat(2, 1), torch.tensor([9, 6]), 64)
        assert passes[-1].positions.tolist() == expected.tolist()
        assert passes[-1].positions[0, :3].tolist() == [5, 12, 18]  # ⌊(t+1)·65/10⌋ − 1
        assert not torch.allclose(out, default(src, torch.tensor([9, 6]), prev)[0])  # not 0..n−1
        assert_incremental_equals_full(model, d)
    model.train()
    with recorded_passes(injector) as passes:
        model(src, torch.tensor([9, 6]), prev)
    assert passes[-1].positions.tolist() != expected.tolist()  # training draws


def test_spaced_evaluation_needs_random_positions():
    with pytest.raises(UserError, match="--pe-random-eval-decoder spaced applies to a model trained with "
                                        "--pe-random-positions only"):
        build_model("--pe-random-eval-decoder", "spaced")
    model, _ = build_model("--pe-random-positions", "64")
    assert model.args.pe_random_eval_decoder == "indices" and not model.decoder.embed_positions.spaced_in_evaluation


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", ["ape-sinusoidal", "rope", "kerple-power"])
def test_spaced_evaluation_in_half_precision_takes_float32s_positions(name, dtype):
    """A model converted to fp16/bf16 (as --fp16/--bf16 generation does) decodes at the float32 model's spaced
    positions, with finite outputs close to float32's, and step by step as its own full pass."""
    flags = (*ALL_ENCODINGS[name], "--pe-random-positions", "64")
    reference, d = build_model(*flags, overrides={"pe_random_eval_decoder": "spaced"})
    model, _ = build_model(*flags, overrides={"pe_random_eval_decoder": "spaced"})
    model = model.to(dtype)
    src, prev = random_tokens(d, 2, 9, left_pad=(0, 3)), random_tokens(d, 2, 7, seed=1)
    with torch.no_grad():
        with recorded_passes(reference.decoder.embed_positions) as expected_passes:
            expected = reference(src, torch.tensor([9, 6]), prev)[0]
        with recorded_passes(model.decoder.embed_positions) as passes:
            got = model(src, torch.tensor([9, 6]), prev)[0]
        assert passes[-1].positions.tolist() == expected_passes[-1].positions.tolist()
        assert got.dtype == dtype and bool(got.isfinite().all())
        assert float((got.float() - expected).abs().max()) < 0.05 * float(expected.abs().max())
        enc = model.encoder(src, torch.tensor([9, 6]))
        state = {}
        for t in range(prev.shape[1]):
            step = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
            torch.testing.assert_close(step[:, -1].float(), got[:, t].float(), rtol=0, atol=0.02 * float(
                got.float().abs().max()))


LEARNED_SPACED = ("--pe-absolute", "learned", "--max-source-positions", "64", "--max-target-positions", "64",
                  "--pe-random-positions", "64")


def test_spaced_evaluation_with_a_learned_table_checks_the_positions_it_uses():
    """Issue 39 4a: with a learned APE of 64 rows and L = 64, a source of 9 and a target of 5 tokens uses spaced
    positions up to 31 (unpadded) and at most 53 for any source lengths a padded batch of width 9 can hold: both fit
    the table and training's range, and the decoder reads the table rows of exactly those positions (the check was
    of L + T = 69 against the table, which refused every evaluation pass)."""
    from fairseq_pe.positional.random_positions import spaced_positions

    model, d = build_model(*LEARNED_SPACED, overrides={"pe_random_eval_decoder": "spaced"})
    injector = model.decoder.embed_positions
    table = injector.absolute.weight[0]
    for pad in ((), (0, 4)):  # unpadded (the encoder returns no mask), and padded
        src, prev = random_tokens(d, 2, 9, left_pad=pad), random_tokens(d, 2, 5, seed=1)
        lengths = torch.tensor([9 - (pad[i] if i < len(pad) else 0) for i in range(2)])
        with torch.no_grad():
            with recorded_passes(injector) as passes:
                model(src, lengths, prev)
            expected = spaced_positions(torch.arange(5).unsqueeze(0).repeat(2, 1), lengths, 64)
            assert passes[-1].positions.tolist() == expected.tolist()
            assert int(expected.max()) < 64 and passes[-1].length <= 64
            torch.testing.assert_close(injector.vectors(passes[-1], 1), table[expected], rtol=0, atol=0)
            assert_incremental_equals_full(model, d)


def test_spaced_evaluation_with_a_learned_table_refuses_a_position_training_never_drew():
    """A hypothesis longer than its source goes on 1 apart past the source's spaced positions: past L − 1 the
    learned table's row was never trained (training draws from [0, L)), so the pass is refused by name, never read
    or clamped.  Decided from the sizes alone (no host sync): exactly when nothing is padded (every source has the
    batch's width m: the last position is pos(m − 1) + T − m), for the worst source length a padded batch of that
    width can hold otherwise."""
    model, d = build_model(*LEARNED_SPACED, overrides={"pe_random_eval_decoder": "spaced"})
    src = random_tokens(d, 2, 9)
    # m = 9: pos(8) = ⌊9·65/10⌋ − 1 = 57, so T = 15 reaches 57 + 6 = 63 (the last trained row) and T = 16 needs 64
    with torch.no_grad():
        with recorded_passes(model.decoder.embed_positions) as passes:
            model(src, torch.tensor([9, 9]), random_tokens(d, 2, 15, seed=1))
        assert int(passes[-1].positions.max()) == 63
        for pad in ((), (0, 4)):
            with pytest.raises(UserError, match=r"--pe-random-eval-decoder spaced with --pe-random-positions 64: 16 "
                                                r"target tokens after a source of 9 tokens.* need position 64"):
                model(random_tokens(d, 2, 9, left_pad=pad), torch.tensor([9, 9 - len(pad) * 2]),
                      random_tokens(d, 2, 16, seed=1))
        # step by step: the same refusal at the step that needs the position
        enc = model.encoder(src, torch.tensor([9, 9]))
        prev, state = random_tokens(d, 2, 16, seed=1), {}
        for t in range(15):
            model.decoder(prev[:, :t + 1], encoder_out=enc, incremental_state=state)
        with pytest.raises(UserError, match="--pe-random-eval-decoder spaced"):
            model.decoder(prev, encoder_out=enc, incremental_state=state)
    # an encoding without a table extrapolates past L as before: nothing refused
    model, d = build_model("--pe-absolute", "sinusoidal", "--pe-random-positions", "64",
                           overrides={"pe_random_eval_decoder": "spaced"})
    with torch.no_grad(), recorded_passes(model.decoder.embed_positions) as passes:
        model(src, torch.tensor([9, 9]), random_tokens(d, 2, 16, seed=1))
    assert int(passes[-1].positions.max()) == 64


def test_the_spaced_bound_is_the_largest_position_plus_one_for_every_source_length_the_shapes_allow():
    """``spaced_position_bound`` against ``spaced_positions`` itself, over every source length 1..width."""
    from fairseq_pe.positional.random_positions import spaced_position_bound, spaced_positions

    for limit in (4, 17, 64):
        for width in range(1, limit + 1, 3):
            for target in range(1, limit + 8, 2):
                indices = torch.arange(target).unsqueeze(0)
                largest = [int(spaced_positions(indices, torch.tensor([m]), limit).max()) for m in range(1, width + 1)]
                assert spaced_position_bound(limit, target, width, padded=False) == largest[-1] + 1
                assert spaced_position_bound(limit, target, width, padded=True) == max(largest) + 1
