"""FLOATER (fairseq_pe/positional/floater*.py): the ODE, its caching, the Q/K/V-bias form,
the recurrent baselines, and their training behaviour."""

import pytest
import torch

from fairseq_pe.positional.floater import FloaterFlow, FloaterNonFiniteError, fairseq_style_floater_args
from fairseq_pe.positional.floater_bias import FloaterAttentionBias

from helpers import assert_incremental_equals_full, build_model, random_tokens

VARIANTS = {
    "input": ("--pe-absolute", "floater"),
    "all-blocks": ("--pe-absolute", "floater", "--pe-all-blocks"),
    "bias": ("--pe-floater-bias",),
    "bias+rpe": ("--pe-floater-bias", "--pe-relative", "learned"),
    "rnn": ("--pe-absolute", "floater", "--pe-all-blocks", "--pe-floater-dynamics", "rnn"),
    "gru-vector": ("--pe-floater-bias", "--pe-floater-dynamics", "gru", "--pe-floater-rnn-input", "vector"),
    "lstm-2": ("--pe-absolute", "floater", "--pe-floater-dynamics", "lstm", "--pe-floater-rnn-layers", "2"),
    "dopri5-adjoint": ("--pe-floater-bias", "--pe-floater-solver", "dopri5", "--pe-floater-adjoint"),
}


def batch(d, src_len=9, tgt_len=7, seed=0):
    src = random_tokens(d, 3, src_len, seed=seed, left_pad=(0, 2, 4))
    prev = random_tokens(d, 3, tgt_len, seed=seed + 1)
    prev[:, 0] = d.eos()
    return src, src.ne(d.pad()).sum(1), prev


def log_probs(model, src, lengths, prev):
    return model.get_normalized_probs(model(src, lengths, prev), log_probs=True)


def standalone_flow(dim=32, blocks=2, seed=0, **options):
    torch.manual_seed(seed)
    flow = FloaterFlow(dim, fairseq_style_floater_args(**options))
    client = FloaterAttentionBias(dim, blocks)
    torch.nn.init.normal_(client.initial)
    flow.add_client("encoder", client)
    return flow.build_dynamics(), client


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_incremental_decoding_equals_full_forward(variant):
    model, d = build_model(*VARIANTS[variant])
    assert_incremental_equals_full(model, d)


@pytest.mark.parametrize("variant", ["bias", "all-blocks"])
def test_a_decoding_step_reads_only_the_new_tokens_rows(variant):
    """A step of step-by-step decoding looks up one row per sentence of FLOATER's states (every block's biases, or
    one block's vectors): no operator of the step writes rows of the states of every position so far (the step used
    to copy them whole, and extend them by a zero row, in every lookup: work growing with the length).  Catches a
    lookup of a copied or concatenated table."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model, d = build_model(*VARIANTS[variant])
    src, lengths, _ = batch(d)
    steps = 24
    prev = random_tokens(d, 3, steps, seed=5)
    prev[:, 0] = d.eos()
    injector = model.decoder.embed_positions
    # a row of the looked-up tables: every block's q/k/v biases, or one block's vector
    row = model.decoder.embed_dim * (injector.self_bias.num_initial_values if variant == "bias" else 1)
    written = []

    class Written(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                      if isinstance(a, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs and t.dim() and \
                        t.size(-1) == row:  # written (not a view), rows of the tables' width
                    written.append((str(func), tuple(t.shape)))
            return out

    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        state = {}
        for t in range(steps - 1):
            model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)
        with Written():
            model.decoder(prev, encoder_out=encoder_out, incremental_state=state)
    assert written, "the step looked nothing up"
    assert max(torch.Size(shape).numel() for _, shape in written) <= 3 * row, written


def test_zero_dynamics_and_initial_values_give_the_base_model_exactly():
    base, d = build_model("--pe-absolute", "sinusoidal")
    floater, _ = build_model("--pe-absolute", "sinusoidal", "--pe-floater-bias")
    missing, unexpected = floater.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and missing and all("floater" in k or "_bias.initial" in k for k in missing)
    src, lengths, prev = batch(d)
    with torch.no_grad():  # trained-looking biases (they start at 0, and h near 0 under the official init)
        for name, p in floater.named_parameters():
            if name.endswith("_bias.initial"):
                p.normal_(std=0.5)
    assert (log_probs(floater, src, lengths, prev) - log_probs(base, src, lengths, prev)).abs().max() > 1e-3
    floater.floater.zero_dynamics()
    with torch.no_grad():
        for name, p in floater.named_parameters():
            if name.endswith("_bias.initial"):
                p.zero_()
    torch.testing.assert_close(log_probs(floater, src, lengths, prev), log_probs(base, src, lengths, prev),
                               rtol=0, atol=0)


def test_per_block_positions_differ_and_share_the_dynamics():
    model, _ = build_model("--pe-absolute", "floater", "--pe-all-blocks")
    enc = model.encoder.embed_positions.absolute
    assert enc.initial.shape == (2, 64)
    with torch.no_grad():
        p1, p2 = enc(20, 1), enc(20, 2)
    assert (p1 - p2).abs().min() > 0  # every coordinate of every position differs between blocks
    # one network per group (encoder, decoder), shared by the blocks; the paper's size at D = 512
    assert model.floater.groups == ["encoder", "decoder"]
    assert sum(p.numel() for p in model.floater.dynamics.parameters()) == 2 * 2 * (65 * 64 + 64)
    flow, _ = standalone_flow(dim=512)
    assert sum(p.numel() for p in flow.dynamics.parameters()) == 526_336  # FLOATER Table 6: 526.3K


def test_rk4_and_dopri5_agree_on_a_smooth_field():
    with torch.no_grad():
        # the paper's unbounded h with nn.Linear's initialisation and the official Δt: a field that moves
        old = dict(pe_floater_dt=0.01, pe_floater_bound=0, pe_floater_init="linear")
        rk4_flow, c1 = standalone_flow(seed=3, **old)
        dopri_flow, c2 = standalone_flow(seed=3, pe_floater_solver="dopri5", pe_floater_rtol=1e-7,
                                         pe_floater_atol=1e-9, **old)
        fine_flow, c3 = standalone_flow(seed=3, pe_floater_step_size=0.002, **old)
        a, b, c = (f.eval().states(cl, 300) for f, cl in ((rk4_flow, c1), (dopri_flow, c2), (fine_flow, c3)))
    assert (a[-1] - a[0]).abs().max() > 0.5  # the states really move
    torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
    torch.testing.assert_close(a, c, rtol=0, atol=2e-5)  # one rk4 step per position = the official Δt/5


def test_gradients_reach_the_dynamics_and_every_initial_value_on_every_update():
    model, d = build_model("--pe-absolute", "floater", "--pe-all-blocks", "--pe-floater-bias")
    model.train()
    floater_params = {n: p for n, p in model.named_parameters() if n.startswith("floater.") or "initial" in n}
    assert len(floater_params) == 4 + 5  # θ (w1, b1, w2, b2) and 5 initial-value tensors
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(3):
        opt.zero_grad()
        src, lengths, prev = batch(d, seed=step)
        model.floater.num_solves = 0
        log_probs(model, src, lengths, prev).mean().backward()
        assert model.floater.num_solves == 1  # one solve for all blocks, Q/K/V, encoder and decoder
        for name, p in floater_params.items():
            assert p.grad is not None and p.grad.abs().sum() > 0, (step, name)
        opt.step()


def test_refresh_period_reuses_the_solution_without_gradient():
    model, d = build_model("--pe-floater-bias", "--pe-floater-refresh-updates", "3")
    model.train()
    solves = []
    for update in range(4):
        model.set_num_updates(update)
        model.zero_grad()
        model.floater.num_solves = 0
        log_probs(model, *batch(d, seed=update)).mean().backward()
        solves.append(model.floater.num_solves)
        w1 = model.floater.dynamics.w1.grad
        assert (w1 is not None and w1.abs().sum() > 0) == (update in (0, 3)), update
    assert solves == [1, 0, 0, 1]


def test_eval_cache_extends_lazily_and_exactly():
    flow, client = standalone_flow()
    flow.eval()
    with torch.no_grad():
        short = flow.states(client, 10).clone()
        n = flow.num_solves
        again = flow.states(client, 7)
        assert flow.num_solves == n  # served from the cache
        extended = flow.states(client, 45)
        assert flow.num_solves == n + 1  # one continuation from the last state
        fresh_flow, fresh_client = standalone_flow()
        fresh = fresh_flow.eval().states(fresh_client, 45)
    torch.testing.assert_close(again, short[:7], rtol=0, atol=0)
    torch.testing.assert_close(extended[:10], short, rtol=0, atol=0)
    torch.testing.assert_close(extended, fresh, rtol=0, atol=1e-6)
    # a parameter change (here: in place, as load_state_dict does) invalidates the cache
    with torch.no_grad():
        flow.dynamics.b2.add_(1.0)
        changed = flow.states(client, 10)
    assert (changed - short).abs().max() > 1e-3


@pytest.mark.parametrize("dynamics", ["ode", "gru"])
def test_positions_extrapolate_to_four_times_the_training_length(dynamics):
    model, d = build_model("--pe-absolute", "floater", "--pe-floater-bias", "--pe-floater-dynamics", dynamics)
    train_len = 16
    src, lengths, prev = batch(d, src_len=4 * train_len, tgt_len=4 * train_len)
    with torch.no_grad():
        out = log_probs(model, src, lengths, prev)
        states = model.floater.states(model.encoder.embed_positions.absolute, 4 * train_len)[:, 0]
    assert torch.isfinite(out).all() and torch.isfinite(states).all()
    steps = (states[1:] - states[:-1]).norm(dim=-1)
    if dynamics == "ode":  # h is bounded by B per coordinate: no step longer than B·Δt·√D at any length
        flow = model.floater
        assert steps.max() <= flow.bound * flow.dt * 64 ** 0.5 + 1e-5
    else:  # continuous: no jump beyond the training length larger than the largest step within it
        assert steps[train_len:].max() <= 2 * steps[:train_len].max()
    assert model.max_positions() == (model.encoder.max_positions(), model.decoder.max_positions())
    assert model.encoder.max_positions() >= 1 << 40  # no maximum length


def test_state_dict_reload_gives_identical_outputs():
    model, d = build_model("--pe-absolute", "floater", "--pe-all-blocks", "--pe-floater-bias", seed=1)
    other, _ = build_model("--pe-absolute", "floater", "--pe-all-blocks", "--pe-floater-bias", seed=2)
    src, lengths, prev = batch(d)
    with torch.no_grad():
        before = log_probs(other, src, lengths, prev)
        other.load_state_dict(model.state_dict())
        after = log_probs(other, src, lengths, prev)
        expected = log_probs(model, src, lengths, prev)
    assert (before - expected).abs().max() > 1e-3
    torch.testing.assert_close(after, expected, rtol=0, atol=0)


def test_non_finite_state_raises_a_clear_error():
    model, d = build_model("--pe-floater-bias", "--pe-floater-bound", "0")  # (a bounded h stays finite)
    with torch.no_grad():
        model.floater.dynamics.w2.fill_(1e30)
        model.floater.dynamics.w1.fill_(1e30)
    model.train()
    with pytest.raises(FloaterNonFiniteError, match="--pe-floater-dt"):
        log_probs(model, *batch(d))


def test_half_precision_model_solves_in_float32():
    model, d = build_model("--pe-floater-bias")
    reference = model.floater.states(model.encoder.embed_positions.self_bias, 12).detach()
    model.half()
    with torch.no_grad():
        states = model.floater.states(model.encoder.embed_positions.self_bias, 12)
    assert states.dtype == torch.float32
    torch.testing.assert_close(states, reference, rtol=0, atol=5e-2)  # only θ's rounding to fp16 differs


def test_freezing_and_learning_rate_scale():
    body, _ = build_model("--pe-floater-bias", "--pe-floater-freeze-body")
    trainable = {n for n, p in body.named_parameters() if p.requires_grad}
    assert trainable == {"floater.dynamics.w1", "floater.dynamics.b1", "floater.dynamics.w2", "floater.dynamics.b2",
                         "encoder.embed_positions.self_bias.initial", "decoder.embed_positions.self_bias.initial",
                         "decoder.embed_positions.cross_bias.initial"}
    dyn, _ = build_model("--pe-floater-bias", "--pe-floater-freeze-dynamics")
    assert not any(p.requires_grad for p in dyn.floater.dynamics.parameters())
    assert dyn.encoder.layers[0].fc1.weight.requires_grad

    plain, c1 = standalone_flow(seed=4)
    scaled, c2 = standalone_flow(seed=4, pe_floater_lr_scale=10.0)
    assert torch.allclose(plain.dynamics.w1, scaled.dynamics.w1 * 10)  # stored θ/s
    moves = []
    for flow, client in ((plain, c1), (scaled, c2)):
        opt = torch.optim.Adam(flow.dynamics.parameters(), lr=1e-3)
        before = [p.detach().float() * flow.lr_scale for p in flow.dynamics.parameters()]
        flow.train()
        flow.states(client, 20).square().sum().backward()
        opt.step()
        after = [p.detach().float() * flow.lr_scale for p in flow.dynamics.parameters()]
        moves.append(sum(float((a - b).abs().sum()) for a, b in zip(after, before)))  # Python floats
    assert moves[1] == pytest.approx(10 * moves[0], rel=1e-3)  # Adam: the effective θ moves S times as far


@pytest.mark.parametrize("flags,message", [
    (("--pe-floater-dt", "0.05"), "need --pe-absolute floater or --pe-floater-bias"),
    (("--pe-floater-bound", "2"), "need --pe-absolute floater or --pe-floater-bias"),
    (("--pe-floater-bias", "--pe-floater-bound", "-1"), "must be positive"),
    (("--pe-floater-bias", "--pe-floater-dynamics", "gru", "--pe-floater-bound", "2"), "ode only"),
    (("--pe-floater-bias", "--pe-floater-dynamics", "lstm", "--pe-floater-init", "linear"), "ode only"),
    (("--pe-floater-bias", "--pe-floater-step-size", "0.003"), "must divide --pe-floater-dt"),
    (("--pe-floater-bias", "--pe-floater-solver", "dopri5", "--pe-floater-step-size", "0.002"), "not to dopri5"),
    (("--pe-floater-bias", "--pe-floater-rnn-layers", "2"), "rnn/gru/lstm only"),
    (("--pe-floater-bias", "--pe-floater-dynamics", "gru", "--pe-floater-adjoint"), "ode only"),
    (("--pe-floater-bias", "--pe-floater-rtol", "1e-3"), "dopri5 only"),
    (("--pe-floater-bias", "--decoder-embed-dim", "32"), "same embedding dimension"),
])
def test_bad_options_name_the_flag(flags, message):
    with pytest.raises(ValueError, match=message):
        build_model(*flags)


def test_floater_flags_reach_the_model_defaults_documented():
    model, _ = build_model("--pe-floater-bias")
    flow = model.floater
    assert (flow.dt, flow.solver, flow.substeps, flow.adjoint, flow.refresh_updates, flow.hidden_dim) == \
        (0.1, "rk4", 1, False, 1, 64)
    assert flow.kind == "ode" and flow.append_time and flow.lr_scale == 1.0
    assert (flow.bound, flow.init, flow.init_gain) == (0.1, "xavier", 1.0)  # the bias form's bound
    absolute, _ = build_model("--pe-absolute", "floater")
    assert absolute.floater.bound == 1.0
    both, _ = build_model("--pe-absolute", "floater", "--pe-floater-bias")
    assert both.floater.bound == 0.1


def test_long_solves_keep_no_graph_and_give_the_same_gradients(monkeypatch):
    """A solve past CHECKPOINT_SOLVE_ELEMENTS keeps no autograd graph in the forward pass (backward solves
    again): far fewer tensors kept for backward, and the same gradients as with the graph kept."""
    import fairseq_pe.positional.floater as floater_module

    model, d = build_model("--pe-absolute", "floater", "--pe-all-blocks", "--pe-floater-bias",
                           "--dropout", "0", "--attention-dropout", "0")
    model.train()
    src, prev = random_tokens(d, 2, 12), random_tokens(d, 2, 9, seed=1)

    def run(threshold):
        monkeypatch.setattr(floater_module, "CHECKPOINT_SOLVE_ELEMENTS", threshold)
        model.zero_grad()
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            out, _ = model(src, torch.tensor([12, 12]), prev)
        out.pow(2).mean().backward()
        return len(saved), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    kept_graph, expected = run(1 << 60)
    recomputed, got = run(1)
    assert recomputed < kept_graph / 2, (recomputed, kept_graph)
    assert got.keys() == expected.keys()
    dynamics = [n for n in got if "floater" in n and "dynamics" in n]
    assert dynamics and any(got[n].abs().sum() > 0 for n in dynamics)
    for name in got:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("solver", ["rk4", "euler", "midpoint"])
@pytest.mark.parametrize("substeps", [1, 5])
def test_the_fixed_grid_solver_is_torchdiffeqs_without_host_syncs(solver, substeps):
    """FLOATER's own loop for the fixed-step solvers gives torchdiffeq's states bit for bit (its rk4 is the 3/8 rule)
    and its gradients to rounding (backward sums in another order), without the comparisons of time tensors of
    torchdiffeq's loop (about 4 host syncs per position)."""
    import torchdiffeq

    from fairseq_pe.diagnostics.op_count import counting
    from fairseq_pe.positional.floater import FloaterDynamics, _StackedField, _fixed_grid, _refined_grid

    torch.manual_seed(0)
    dynamics = FloaterDynamics(3, 16, 16, bound=1.0)
    times = torch.arange(0, 30, dtype=torch.float32) * 0.1
    y = torch.randn(3, 4, 16, requires_grad=True)
    expected = torchdiffeq.odeint(_StackedField(dynamics), y, times, method=solver,
                                  options={"grid_constructor": _refined_grid(substeps)})
    with counting() as ops:
        got = _fixed_grid(_StackedField(dynamics), y, times, substeps, solver)
    assert torch.equal(got, expected) and ops.syncs == 0
    weights = torch.randn_like(got)
    for a, b in zip(torch.autograd.grad((got * weights).sum(), [y, dynamics.w1, dynamics.w2]),
                    torch.autograd.grad((expected * weights).sum(), [y, dynamics.w1, dynamics.w2])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
