"""The encodings of 2024-2025 that read the attention's logits or its input, through the attention's logits hook
(``own_logits``, ``key_state``, ``attention_logits``): FoX, CoPE and DAPE (v1, v2), against direct implementations
of their papers' equations (loops over i, j, t), step by step equal to the full pass, left padding, their refusals
by name.  fp16 / bf16, training, the language model, the attention's paths and the CLI run them through the
catalogue's group "encodings" (tests/helpers.py ALL_ENCODINGS), tests/test_cli_e2e.py and tests/test_lm.py."""

import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_pe.errors import UserError
from fairseq_pe.models.options import validate_position_args

from helpers import assert_incremental_equals_full, build_model, random_tokens

H, D, E = 4, 16, 64  # the tiny model's heads, head dimension and embedding dimension


def encoding(name, causal, *flags):
    model, d = build_model("--pe-absolute", "none", "--pe-relative", name, *flags)
    side = model.decoder if causal else model.encoder
    return side.embed_positions.relative, model, d


def queries_keys(batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, H, length, D, generator=g) * D ** -0.5, torch.randn(batch, H, length, D, generator=g),
            torch.randn(length, batch, E, generator=g))


def left_padded_masking(length, causal, side="left"):
    """Two rows of ``length`` keys, the second left-padded by 2 (``side`` "right": right-padded): the padding
    (2, length), True at padding, and the attention's additive masking (2, 1, length, length), causal too in the
    decoder."""
    padding = torch.zeros(2, length, dtype=torch.bool)
    padding[1, :2] = side == "left"
    padding[1, -2:] = side == "right"
    masking = torch.zeros(2, 1, length, length).masked_fill(padding.view(2, 1, 1, length), float("-inf"))
    if causal:
        masking = masking.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    return padding, masking


# FoX (Lin et al. 2025)

@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
def test_fox_adds_the_sums_of_log_forget_gates_between_key_and_query(causal):
    """logits_ij = q_i·k_j/√d + Σ_{l=j+1..i} log σ(w_h·x_l + b_h) for j ≤ i; in the encoder Σ_{l=i+1..j} log σ(r_h·x_l
    + c_h) for j > i, with a second set of gates (x-transformers' DataDependentAlibi); padding's gates are 1."""
    fox, _, _ = encoding("fox", causal)
    with torch.no_grad():
        fox.gate_bias.normal_()  # gates away from their initial 0.5
    block, length = 2, 7
    q, k, x = queries_keys(2, length)
    padding = torch.zeros(2, length, dtype=torch.bool)
    padding[1, :2] = True  # left padding of the second row
    state = fox.key_state(x, padding, block)
    got = fox.attention_logits(q, k, 0, block, state=state)
    w, b = fox.gate_weight[block - 1].detach().double(), fox.gate_bias[block - 1].detach().double()
    expected = torch.empty(2, H, length, length, dtype=torch.float64)
    for n in range(2):
        def log_gate(gate, l):
            return 0.0 if padding[n, l] else F.logsigmoid(w[gate] @ x[l, n].double() + b[gate]).item()

        for h in range(H):
            for i in range(length):
                for j in range(length):
                    if j <= i:
                        bias = sum(log_gate(h, l) for l in range(j + 1, i + 1))
                    else:
                        bias = 0.0 if causal else sum(log_gate(H + h, l) for l in range(i + 1, j + 1))
                    expected[n, h, i, j] = q[n, h, i].double() @ k[n, h, j].double() + bias
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    # a block of rows (the blockwise path) reads its own rows of the same sums
    rows = fox.attention_logits(q[:, :, 3:5], k, 3, block, state=state)
    torch.testing.assert_close(rows, got[:, :, 3:5])


def test_fox_gates_start_as_the_reference_and_follow_their_flags():
    fox, _, _ = encoding("fox", True)
    assert fox.gate_weight.shape == (2, H, E) and fox.gate_bias.shape == (2, H)  # one gate per layer and head
    assert abs(fox.gate_weight.std().item() - 0.02) < 0.004 and fox.gate_bias.abs().max() == 0
    encoder, _, _ = encoding("fox", False, "--pe-fox-gate-bias", "5", "--pe-fox-gate-std", "0")
    assert encoder.gate_weight.shape == (2, 2 * H, E)  # the encoder's forward and backward gates
    assert encoder.gate_weight.abs().max() == 0 and (encoder.gate_bias == 5).all()


# CoPE (Golovneva et al. 2024)

@pytest.mark.parametrize("nodiv", [False, True], ids=["div", "nodiv"])
@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
def test_cope_adds_the_interpolated_embedding_of_the_gated_count(causal, nodiv):
    """g_it = σ(q_i·k_t/√d) over the visible keys t; p_ij = Σ_{t ≥ j} g_it (t ≤ i in the decoder; to the end in the
    encoder), at most npos − 1; logits_ij = (q_i·k_j + q_i·E[p_ij])/√d, E interpolated between ⌊p⌋ and ⌈p⌉ (with
    --pe-cope-nodiv the position term is added after the division)."""
    npos = 4  # below the longest count: the clamp is exercised
    cope, _, _ = encoding("cope", causal, "--pe-cope-npos", str(npos), *(["--pe-cope-nodiv"] if nodiv else []))
    with torch.no_grad():
        cope.pos_emb.normal_()
    block, length = 1, 7
    q, k, _ = queries_keys(2, length, seed=1)  # q already times 1/√d, as the attention hands it
    padding, masking = left_padded_masking(length, causal)
    got = cope.attention_logits(q, k, 0, block, masking=masking)
    table = cope.pos_emb[block - 1].detach().double()  # (d, npos)
    expected = torch.empty(2, H, length, length, dtype=torch.float64)
    clamped = 0
    for n in range(2):
        for h in range(H):
            for i in range(length):
                unscaled = q[n, h, i].double() * math.sqrt(D)
                visible = [t for t in range(length) if not padding[n, t] and (t <= i or not causal)]
                for j in range(length):
                    p = sum(torch.sigmoid(unscaled @ k[n, h, t].double() / math.sqrt(D)).item()
                            for t in visible if t >= j)
                    clamped += p > npos - 1
                    p = min(p, npos - 1)
                    low, high = math.floor(p), math.ceil(p)
                    e = (unscaled @ table[:, low]) * (1 - (p - low)) + (unscaled @ table[:, high]) * (p - low)
                    logit = unscaled @ k[n, h, j].double()
                    expected[n, h, i, j] = logit / math.sqrt(D) + e if nodiv else (logit + e) / math.sqrt(D)
    assert clamped > 0
    visible = masking.expand(2, H, length, length) == 0
    torch.testing.assert_close(got.double()[visible], expected[visible], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
def test_cope_interpolation_has_the_references_values_and_gradients(causal):
    """The term z[⌊p⌋] + w·(z[⌊p⌋+1] − z[⌊p⌋]) (seven kernels) against the reference's z[⌈p⌉]·w + z[⌊p⌋]·(1 − w)
    (eleven), written here as RAM's ``ContextPosSelfAttn``: the same logits and the same gradients of q, k and E, with
    positions clamped at npos − 1, whole positions (gates of exactly 1 and 0) and masked keys.  Catches a step that
    reads past the table's last column, a floor that carries a gradient, or a weight taken from ⌈p⌉."""
    npos = 5
    cope, _, _ = encoding("cope", causal, "--pe-cope-npos", str(npos))
    with torch.no_grad():
        cope.pos_emb.normal_()
    block, length = 1, 9
    q, k, _ = queries_keys(2, length, seed=3)
    with torch.no_grad():  # saturated gates: σ = 1.0 and 0.0 in float32, whole counts
        k[0, 0, :3] = q[0, 0, -1:] * 1e4
        k[0, 1, :3] = -q[0, 1, -1:] * 1e4
    _, masking = left_padded_masking(length, causal)

    def reference(q, k, table):
        scaled = q @ k.transpose(-1, -2)
        gates = torch.sigmoid(scaled) * (masking == 0)
        positions = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos - 1)
        fixed = q @ table[:, :min(npos, length + 1)]
        floor = positions.detach().floor()
        weight = positions - floor
        ceil = positions.detach().ceil().long()
        return scaled + fixed.gather(-1, ceil) * weight + fixed.gather(-1, floor.long()) * (1 - weight)

    visible = masking.expand(2, H, length, length) == 0
    outputs = []
    for compute in (lambda q, k, table: cope.attention_logits(q, k, 0, block, masking=masking), reference):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        cope.pos_emb.grad = None
        got = compute(qq, kk, cope.pos_emb[block - 1])
        weights = torch.randn(got.shape, generator=torch.Generator().manual_seed(0))
        (got[visible] * weights[visible]).sum().backward()
        outputs.append((got[visible].detach(), qq.grad, kk.grad, cope.pos_emb.grad[block - 1].clone()))
    for new, old in zip(*outputs):
        torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-5)


def test_cope_starts_at_zero_and_its_table_follows_the_longest_sequence():
    cope, model, d = encoding("cope", True, "--max-target-positions", "40")
    assert cope.pos_emb.shape == (2, D, 41) and cope.pos_emb.abs().max() == 0  # the reference's block size + 1
    q, k, _ = queries_keys(1, 5)
    torch.testing.assert_close(cope.attention_logits(q, k, 0, 1), q @ k.transpose(-1, -2))  # nothing added at init


# DAPE (Zheng et al. 2024)

@pytest.mark.parametrize("version", ["v1", "v2"])
def test_dape_steps_build_no_mask_per_layer_and_copy_no_features(version):
    """v2's masks of the keys and hidden units its convolutions zero depend on the positions and the step's masks
    only: a decoding step builds them once, whatever the layers (the same operators per step with 2 layers and with
    4, but for each layer's own); v1's step concatenates [logits; bias] channels last, as its product reads them (no
    copy of them per layer).  Catches the masks built in every layer, and the features concatenated channels first
    (a clone per layer)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    counts = {}
    for layers in (2, 4):
        model, d = build_model("--pe-absolute", "none", "--pe-relative", "alibi", "--pe-dape", version,
                               "--decoder-layers", str(layers))
        src = random_tokens(d, 2, 6)
        prev = random_tokens(d, 2, 5, seed=1)
        ops = Counter()

        class Count(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                ops[func.overloadpacket.__name__] += 1
                return func(*args, **(kwargs or {}))

        with torch.no_grad():
            encoder_out = model.encoder(src, src_lengths=torch.tensor([6, 6]))
            state = {}
            for t in range(4):
                model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)
            with Count():
                model.decoder(prev, encoder_out=encoder_out, incremental_state=state)
        counts[layers] = ops
    for name in ("arange", "gt", "lt", "ne", "clone"):
        assert counts[4][name] == counts[2][name], (name, counts[2][name], counts[4][name])
    kernel = "convolution" if version == "v2" else "leaky_relu"
    assert counts[4][kernel] == 2 * counts[2][kernel] >= 4  # the layers did run


def direct_dape(logits, bias, dape, block, causal, padding):
    """logits + B + f([logits; B]) written out (float64): v1 the MLP per (b, i, j); v2 per query row, the two 1×k
    convolutions tap by tap over the row's keys, hidden keys (future, padding) 0 in X, the hidden layer 0 at padding
    keys (in the decoder those before the query), and in the decoder the row continued by k//2 zero keys."""
    w1, b1, w2, b2 = (t[block - 1].detach().double() for t in (dape.w1, dape.b1, dape.w2, dape.b2))
    batch, heads, length, _ = logits.shape
    x = torch.cat([logits, bias.expand(batch, heads, length, length)], 1).double()  # (B, 2H, T, S)
    expected = torch.empty(batch, heads, length, length, dtype=torch.float64)
    act = torch.nn.functional.leaky_relu
    for n in range(batch):
        for i in range(length):
            if dape.version == "v1":
                for j in range(length):
                    expected[n, :, i, j] = w2 @ act(w1 @ x[n, :, i, j] + b1) + b2
                continue
            pad = dape.kernel // 2
            seen = [j for j in range(length) if not padding[n, j] and (j <= i or not causal)]
            row = torch.zeros(2 * heads, length + pad, dtype=torch.float64)
            row[:, seen] = x[n, :, i, seen]
            width = length + pad if causal else length
            hidden = torch.zeros(w1.size(0), width, dtype=torch.float64)
            for j in range(width):
                total = b1.clone()
                for tap in range(dape.kernel):
                    m = j + tap - pad
                    if 0 <= m < width:
                        total += w1[:, :, 0, tap] @ row[:, m]
                hidden[:, j] = 0.0 if (j < length and padding[n, j] and (j < i or not causal)) else act(total)
            for j in range(length):
                total = b2.clone()
                for tap in range(dape.kernel):
                    m = j + tap - pad
                    if 0 <= m < width:
                        total += w2[:, :, 0, tap] @ hidden[:, m]
                expected[n, :, i, j] = total
    return expected + logits.double() + bias.double()


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
def test_dape_adds_its_network_of_the_logits_and_the_bias(causal, version, side):
    dape, _, _ = encoding("kerple-log", causal, "--pe-dape", version, *(["--pe-dape-kernel", "5"] if version == "v2"
                                                                        and not causal else []))
    block, length = 2, 7
    q, k, _ = queries_keys(2, length, seed=2)
    padding, masking = left_padded_masking(length, causal, side)
    got = dape.attention_logits(q, k, 0, block, masking=masking)
    bias = dape.base.position_bias(length, length, 0, block).detach()
    expected = direct_dape(q @ k.transpose(-1, -2), bias, dape, block, causal, padding)
    visible = masking.expand(2, H, length, length) == 0
    torch.testing.assert_close(got.double()[visible], expected[visible], rtol=1e-5, atol=1e-5)
    # a block of rows (the blockwise path; a decoding step is the last row) reads its own rows of the same logits
    rows = dape.attention_logits(q[:, :, 4:6], k, 4, block, masking=masking[..., 4:6, :])
    torch.testing.assert_close(rows[visible[:, :, 4:6]], got[:, :, 4:6][visible[:, :, 4:6]])


@pytest.mark.parametrize("flags", [["--pe-relative", "alibi", "--pe-dape", "v1"],
                                   ["--pe-relative", "kerple-log", "--pe-dape", "v2"],
                                   ["--pe-relative", "fire", "--pe-dape", "v2", "--pe-dape-kernel", "5"]], ids=" ".join)
def test_dape_outputs_at_real_tokens_are_those_of_the_sentence_alone_whichever_side_it_is_padded(flags):
    """One sentence alone, left-padded and right-padded (as roberta_pe's and the language model's batches, and
    fairseq's targets): its encoder outputs and decoder log-probs are the same at its tokens.  v2's first
    convolution's outputs at padding keys after the query (the encoder's right padding) must not reach the second
    convolution at the last real keys."""
    model, d = build_model("--pe-absolute", "none", *flags)
    n, extra = 6, 3
    alone = random_tokens(d, 1, n, seed=4)
    filler = torch.full((1, extra), d.pad())
    padded = {"left": (torch.cat([filler, alone], 1), slice(extra, None)),
              "right": (torch.cat([alone, filler], 1), slice(0, n))}
    prev = random_tokens(d, 1, n, seed=5)
    prev[:, 0] = d.eos()
    prev_padded = {"left": torch.cat([filler, prev], 1), "right": torch.cat([prev, filler], 1)}
    with torch.no_grad():
        enc = model.encoder(alone, torch.tensor([n]))
        expected_enc = enc["encoder_out"][0][:, 0]
        expected_dec = model.get_normalized_probs(model.decoder(prev, encoder_out=enc), log_probs=True)[0]
        for side, (tokens, real) in padded.items():
            got = model.encoder(tokens, torch.tensor([n]))["encoder_out"][0][real, 0]
            torch.testing.assert_close(got, expected_enc, rtol=1e-6, atol=1e-6, msg=lambda m: f"encoder, {side}: {m}")
            out = model.decoder(prev_padded[side], encoder_out=enc)
            got = model.get_normalized_probs(out, log_probs=True)[0, real]
            torch.testing.assert_close(got, expected_dec, rtol=1e-6, atol=1e-6, msg=lambda m: f"decoder, {side}: {m}")


def test_dape_is_refused_by_name_without_a_bias_and_its_options_without_it():
    for name in ("rope", "learned", "fox"):
        with pytest.raises(UserError, match=f"--pe-dape v1 needs an additive position bias .* --pe-relative {name} "
                                            "has none"):
            build_model("--pe-absolute", "none", "--pe-relative", name, "--pe-dape", "v1")
    with pytest.raises(UserError, match="--pe-dape-kernel applies to --pe-dape v2 only"):
        build_model("--pe-absolute", "none", "--pe-relative", "alibi", "--pe-dape", "v1", "--pe-dape-kernel", "3")
    with pytest.raises(UserError, match="--pe-dape-kernel must be an odd number"):
        build_model("--pe-absolute", "none", "--pe-relative", "alibi", "--pe-dape", "v2", "--pe-dape-kernel", "4")


# the model around them

def nonzero_positions(model):
    """CoPE's tables away from their initial zeros (FoX's gates are position-dependent from the start)."""
    torch.manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("relative.pos_emb"):
                p.normal_()
    return model


@pytest.mark.parametrize("flags", [["--pe-relative", "fox"], ["--pe-relative", "cope"],
                                   ["--pe-relative", "alibi", "--pe-dape", "v1"],
                                   ["--pe-relative", "fire", "--pe-dape", "v2"]], ids=" ".join)
def test_step_by_step_decoding_equals_the_full_pass_and_left_padding_changes_nothing(flags):
    model, d = build_model("--pe-absolute", "none", *flags)
    nonzero_positions(model)
    assert_incremental_equals_full(model, d)
    src = random_tokens(d, 2, 9, left_pad=(0, 3))
    out = model.encoder(src, torch.tensor([9, 6]))["encoder_out"][0]
    alone = model.encoder(src[1:, 3:], torch.tensor([6]))["encoder_out"][0]
    torch.testing.assert_close(out[3:, 1], alone[:, 0], rtol=1e-5, atol=1e-5)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(3))  # the encoder is order aware
    shuffled = model.encoder(src[:1, perm], torch.tensor([9]))["encoder_out"][0]
    assert (shuffled - out[perm, :1]).abs().max() > 1e-3


@pytest.mark.parametrize("flags, message", [
    (["--pe-relative", "fox", "--pe-random-positions", "64"], "--pe-random-positions has no effect with --pe-relative fox"
                                                               ", which takes no positions"),
    (["--pe-relative", "cope", "--pe-random-positions", "64"], "--pe-random-positions has no effect with --pe-relative "
                                                                "cope"),
    (["--pe-relative", "cope", "--pe-cope-npos", "1"], "--pe-cope-npos must be at least 2"),
    (["--pe-relative", "alibi", "--pe-fox-gate-bias", "5"], "--pe-fox-gate-bias applies to --pe-relative fox only"),
    (["--pe-relative", "fox", "--pe-cope-nodiv"], "--pe-cope-nodiv applies to --pe-relative cope only"),
])
def test_ineffective_or_out_of_range_options_are_refused_by_name(flags, message):
    with pytest.raises(UserError, match=message):
        build_model("--pe-absolute", "none", *flags)


@pytest.mark.parametrize("name", ["fox", "cope"])
def test_untying_what_is_per_layer_already_is_refused_by_name(name):
    with pytest.raises(UserError, match=f"--pe-relative-untie-layers has no effect with --pe-relative {name}"):
        build_model("--pe-absolute", "none", "--pe-relative", name, "--pe-relative-untie-layers")
