"""FLOATER under activation checkpointing and with an adaptive solver.

* ``--checkpoint-activations``: every FLOATER form gives the gradients it gives without it, with
  one ODE solve per training step (the Q/K/V-bias form used to crash with "Trying to backward
  through the graph a second time").
* ``--pe-floater-solver dopri5``: the evaluation cache gives the same positions however it grew,
  so results do not depend on the batch size (they used to differ by up to 7.8e-3 per token).
"""

import pytest
import torch

from fairseq_pe.positional.floater import FloaterFlow, FloaterPositionEncoding, fairseq_style_floater_args

from helpers import build_model, random_tokens

FORMS = {
    "bias": ("--pe-floater-bias",),
    "all-blocks": ("--pe-absolute", "floater", "--pe-all-blocks"),
    "bias+all-blocks": ("--pe-floater-bias", "--pe-absolute", "floater", "--pe-all-blocks"),
    "bias-dopri5": ("--pe-floater-bias", "--pe-floater-solver", "dopri5"),
    "bias-gru": ("--pe-floater-bias", "--pe-floater-dynamics", "gru"),
}


def training_gradients(*flags):
    model, d = build_model(*flags, "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0")
    model.train()
    with torch.no_grad():  # non-zero biases, so that they matter
        for p in model.floater.parameters():
            p.add_(0.05 * torch.randn_like(p))
    solves = model.floater.num_solves
    out, _ = model(random_tokens(d, 3, 9, left_pad=(0, 2)), torch.tensor([9, 7, 9]), random_tokens(d, 3, 7, seed=1))
    out.float().pow(2).mean().backward()
    solves = model.floater.num_solves - solves
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, solves


@pytest.mark.parametrize("form", FORMS)
def test_activation_checkpointing_gives_the_same_gradients(form):
    plain, plain_solves = training_gradients(*FORMS[form])
    checkpointed, solves = training_gradients(*FORMS[form], "--checkpoint-activations")
    assert plain.keys() == checkpointed.keys()
    floater = [n for n in plain if n.startswith("floater.") or "embed_positions" in n]
    assert floater and all(plain[n].abs().sum() > 0 for n in floater)  # FLOATER's parameters learn
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-4, atol=1e-7, msg=name)
    assert plain_solves == solves == 1  # the recomputation does not solve again


def strong_flow(solver="dopri5", dim=16):
    """A flow whose dynamics grow fast (weights ×5): adaptive steps vary a lot along the path."""
    torch.manual_seed(0)
    flow = FloaterFlow(dim, fairseq_style_floater_args(pe_floater_solver=solver))
    client = FloaterPositionEncoding(dim)
    flow.add_client("encoder", client)
    flow.build_dynamics()
    with torch.no_grad():
        for p in flow.dynamics.parameters():
            p.mul_(5)
    return flow.eval(), client


@pytest.mark.parametrize("solver", ["dopri5", "rk4"])
def test_the_evaluation_cache_does_not_depend_on_how_it_grew(solver):
    one_shot, c1 = strong_flow(solver)
    grown, c2 = strong_flow(solver)
    with torch.no_grad():
        expected = one_shot.states(c1, 200).clone()
        for length in (3, 7, 20, 33, 90, 150, 200):
            got = grown.states(c2, length)
            assert torch.equal(got, expected[:length]), (solver, length)
        # and what training solves (from 0, the batch's length) is the same prefix
        assert torch.equal(grown._solve(grown._initial(), 0, 57)[0], expected[:57])


def test_dopri5_translation_scores_do_not_depend_on_the_batch_size():
    model, d = build_model("--pe-floater-bias", "--pe-floater-solver", "dopri5")
    with torch.no_grad():
        for p in model.floater.parameters():
            p.add_(0.3 * torch.randn_like(p))
    lengths = [3, 11, 6, 17, 9, 14]
    sources = [random_tokens(d, 1, n, seed=n) for n in lengths]
    prevs = [random_tokens(d, 1, n + 1, seed=100 + n) for n in lengths]

    def score(i):
        out, _ = model(sources[i], torch.tensor([lengths[i]]), prevs[i])
        return model.get_normalized_probs((out, None), log_probs=True)

    with torch.no_grad():
        model.floater._cache = None
        one_by_one = [score(i) for i in range(len(lengths))]  # the cache grows sentence by sentence
        model.floater._cache = None
        model.floater.states(model.floater._clients[0][1], 64)  # one long solve first
        after_long = [score(i) for i in range(len(lengths))]
    for a, b in zip(one_by_one, after_long):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
