"""xPos (issue 18): RoPE times ζ_i^((n−m)/B) in the decoder, plain RoPE in the encoder (see its docstring); its
float32 scaled queries and keys stay float32 under autocast (issue 39, 4e)."""

import pytest
import torch

from fairseq_pe.errors import UserError
from fairseq_pe.positional.pass_state import pass_scope
from fairseq_pe.positional.rotary import FP16_SCALED_LENGTH

from helpers import assert_incremental_equals_full, build_model, random_tokens
from training import TINY, batch, build_trainer, dictionary_dir


def sides():
    model, d = build_model("--pe-absolute", "none", "--pe-relative", "xpos")
    return model.encoder.embed_positions.relative, model.decoder.embed_positions.relative, model, d


def logit(enc, q, k, n, m):
    """q at position n, k at position m, each rotated (and scaled) as the attention does."""
    rq, _ = enc.rotate(q, q, n, 1)
    _, rk = enc.rotate(k, k, m, 1)
    return float((rq * rk).sum())


def test_each_frequency_pair_decays_as_zeta_to_the_distance_over_b():
    """A query and a key living on frequency pair i only: the xPos logit is ζ_i^((n−m)/512) times RoPE's,
    ζ_i = (2i/d + 0.4)/1.4, by hand for d = 16: ζ_0 = 0.4/1.4, ζ_3 = (6/16 + 0.4)/1.4."""
    encoder, decoder, _, _ = sides()
    d = decoder.head_dim
    torch.manual_seed(0)
    for i, zeta in ((0, 0.4 / 1.4), (3, (6 / 16 + 0.4) / 1.4)):
        q, k = torch.zeros(1, 1, 1, d), torch.zeros(1, 1, 1, d)
        q[..., 2 * i:2 * i + 2], k[..., 2 * i:2 * i + 2] = torch.randn(2), torch.randn(2)
        for n, m in ((700, 100), (40, 40), (1500, 3)):
            rope = logit(encoder, q, k, n, m)  # the encoder side is plain RoPE
            assert logit(decoder, q, k, n, m) == pytest.approx(zeta ** ((n - m) / 512) * rope, rel=1e-4, abs=1e-7)


def test_the_decay_depends_on_the_distance_only():
    _, decoder, _, _ = sides()
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 1, decoder.head_dim), torch.randn(1, 1, 1, decoder.head_dim)
    values = [logit(decoder, q, k, m + 37, m) for m in (0, 100, 2000, 9000)]
    assert max(values) - min(values) < 1e-4 * max(abs(v) for v in values)


def test_step_by_step_decoding_equals_the_full_pass():
    _, _, model, d = sides()
    assert_incremental_equals_full(model, d)


def test_beyond_float32s_range_is_an_error_naming_the_flag():
    _, decoder, _, _ = sides()
    q = torch.randn(1, 1, 1, decoder.head_dim)
    decoder.rotate(q, q, decoder.max_length - 1, 1)
    with pytest.raises(UserError, match="--pe-relative xpos: position"):
        decoder.rotate(q, q, decoder.max_length, 1)


#: past FP16_SCALED_LENGTH's margin: ζ_0^(−m/512) = 2.0e5 at m = 5,000, so a key of size 0.33 overflows fp16
AUTOCAST_LENGTH = 5000


@pytest.fixture
def sdpa_dtypes(monkeypatch):
    """The dtype every scaled_dot_product_attention call of the model computes in (its output's: autocast casts its
    inputs on the way in), with the queries' length."""
    import torch.nn.functional as F

    original, seen = F.scaled_dot_product_attention, []

    def recording(q, k, v, *args, **kwargs):
        out = original(q, k, v, *args, **kwargs)
        seen.append((q.size(-2), out.dtype))
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return seen


def test_under_autocast_the_scaled_queries_and_keys_stay_float32(sdpa_dtypes):
    """--amp (CUDA's autocast, fp16) puts SDPA on its lower-precision list: it cast xPos's float32 scaled queries and
    keys back to fp16, whose keys overflow past a few thousand positions (issue 39, 4e).  CPU autocast to fp16 (the
    same lists) shows it: before the fix every position from 4,096 on gave NaN log-probabilities (904 of 5,000).
    Under autocast the decoder's self-attention over 5,000 positions runs in float32 and gives the float32 model's
    log-probabilities to fp16's rounding of the other layers; short passes keep autocast's fp16."""
    _, _, model, d = sides()
    src, prev = random_tokens(d, 1, 5), random_tokens(d, 1, AUTOCAST_LENGTH, seed=1)
    with torch.no_grad():
        full = model.get_normalized_probs(model(src, torch.tensor([5]), prev), log_probs=True)
        del sdpa_dtypes[:]
        with torch.autocast("cpu", dtype=torch.float16):
            amp = model.get_normalized_probs(model(src, torch.tensor([5]), prev), log_probs=True)
            short = model(src, torch.tensor([5]), prev[:, :FP16_SCALED_LENGTH - 1])
    self_attention = [dtype for length, dtype in sdpa_dtypes if length == AUTOCAST_LENGTH]
    assert self_attention == [torch.float32] * 2, sdpa_dtypes  # both decoder layers
    assert {dtype for length, dtype in sdpa_dtypes if length != AUTOCAST_LENGTH} == {torch.float16}
    assert short[0].dtype == torch.float16
    assert torch.isfinite(amp).all()
    torch.testing.assert_close(amp.float(), full, rtol=0, atol=0.02)


def test_under_autocast_the_explicit_path_stays_float32():
    """The explicit path (weights requested; step-by-step decoding) multiplies with bmm, also on autocast's list."""
    _, decoder, model, _ = sides()
    attention = model.decoder.layers[0].self_attn
    torch.manual_seed(2)
    x = torch.randn(AUTOCAST_LENGTH, 1, attention.embed_dim)
    future = torch.triu(torch.full((AUTOCAST_LENGTH, AUTOCAST_LENGTH), float("-inf")), 1)
    tokens = torch.full((1, AUTOCAST_LENGTH), 4)  # a pass of positions 0 .. n−1 (each call its own)
    injector = model.decoder.embed_positions
    with torch.no_grad():
        with pass_scope(injector.build_pass(tokens)):
            full, _ = attention(x, x, x, attn_mask=future, need_weights=True)
        with pass_scope(injector.build_pass(tokens)), torch.autocast("cpu", dtype=torch.float16):
            amp, _ = attention(x, x, x, attn_mask=future, need_weights=True)
    assert torch.isfinite(amp).all()
    torch.testing.assert_close(amp.float(), full, rtol=0, atol=0.02)


def test_fairseqs_amp_training_step_over_5000_positions(tmp_path, monkeypatch):
    """fairseq's real --amp path: its Trainer with AMPOptimizer, whose task.train_step runs the forward pass under
    ``torch.cuda.amp.autocast``; on the CPU that autocast is made CPU autocast to fp16 (the same lists).  The update
    is taken, its loss is the float32 loss to fp16's rounding, and the parameters stay finite.  Before the fix the
    gradients overflowed (fairseq's overflow branch then failed on the CPU's disabled GradScaler)."""
    monkeypatch.setattr(torch.cuda.amp, "autocast",
                        lambda enabled=True, **kwargs: torch.autocast("cpu", dtype=torch.float16, enabled=enabled))
    trainer = build_trainer(dictionary_dir(tmp_path), *TINY, "--amp", "--pe-absolute", "none", "--pe-relative", "xpos")
    sample = batch(trainer.task.target_dictionary, [7], [AUTOCAST_LENGTH])
    float32 = trainer.valid_step(sample)["loss"]  # evaluation: no autocast
    trained = trainer.train_step([sample])
    assert type(trainer.optimizer).__name__ == "AMPOptimizer" and trainer.get_num_updates() == 1
    assert trained["loss"] == pytest.approx(float32, abs=0.01)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
