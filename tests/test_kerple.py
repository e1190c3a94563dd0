"""KERPLE (issue 18): the two kernels against a hand computation of the paper's Eq. 7-8, the projection
that keeps r₁, r₂ in range, parameters per layer and head, and a trained model that reloads exactly."""

import argparse
import math
from types import SimpleNamespace

import pytest
import torch
from fairseq.models import ARCH_CONFIG_REGISTRY

from fairseq_pe.errors import UserError
from fairseq_pe.models.options import upgrade_saved_options
from fairseq_pe.models.transformer_pe import TransformerPEModel
from fairseq_pe.positional import build_position_encoding
from fairseq_pe.positional.kerple import EPS

from helpers import build_model, dictionary, fairseq_optimizer, optimizer_masters, random_tokens


def kerple(name, heads=2, blocks=2, causal=False, **args):
    return build_position_encoding("relative", name, embed_dim=8 * heads, num_heads=heads, num_blocks=blocks,
                                   causal=causal, args=SimpleNamespace(**args))


def set_params(enc, r1, r2):
    with torch.no_grad():
        enc.r1.copy_(torch.tensor(r1))
        enc.r2.copy_(torch.tensor(r2))


def test_log_kernel_by_hand():
    """−r₁·log(1 + r₂·|i − j|): head 0 with r₁ = 0.5, r₂ = 2; head 1 with r₁ = 1, r₂ = 0.25 (block 1)."""
    enc = kerple("kerple-log", pe_relative_untie_layers=True)
    set_params(enc, [[0.5, 1.0], [3.0, 3.0]], [[2.0, 0.25], [3.0, 3.0]])
    bias = enc.position_bias(3, 3, 0, 1)
    assert bias[0, 0, 2].item() == pytest.approx(-0.5 * math.log(5))   # |0 − 2| = 2: 1 + 2·2
    assert bias[0, 2, 1].item() == pytest.approx(-0.5 * math.log(3))
    assert bias[1, 1, 0].item() == pytest.approx(-math.log(1.25))
    assert torch.all(bias.diagonal(dim1=1, dim2=2) == 0)
    torch.testing.assert_close(bias, bias.transpose(1, 2))  # symmetric in the encoder
    assert enc.position_bias(3, 3, 0, 2)[0, 0, 1].item() == pytest.approx(-3 * math.log(4))  # block 2's own


def test_power_kernel_by_hand():
    """−r₁·|i − j|^r₂: r₁ = 0.5, r₂ = 1.5 and r₁ = 2, r₂ = 1 (ALiBi with slope 2)."""
    enc = kerple("kerple-power", causal=True, pe_relative_untie_layers=True)
    set_params(enc, [[0.5, 2.0], [1.0, 1.0]], [[1.5, 1.0], [1.0, 1.0]])
    bias = enc.position_bias(4, 4, 0, 1)
    assert bias[0, 3, 0].item() == pytest.approx(-0.5 * 3 ** 1.5)
    assert bias[1, 3, 1].item() == pytest.approx(-4.0)
    # one decoding step: the query at index 3 sees the row of the full pass
    torch.testing.assert_close(enc.position_bias(1, 4, 3, 1), bias[:, 3:4])


@pytest.mark.parametrize("name,high", [("kerple-log", None), ("kerple-power", 2.0)])
def test_values_out_of_range_are_used_clamped(name, high):
    """A value set by other means than a fairseq optimizer (which projects it) is used clamped into range."""
    enc = kerple(name, pe_relative_untie_layers=True)
    set_params(enc, [[-1.0, 0.0], [5.0, 0.3]], [[-2.0, 7.0], [0.001, 1.0]])
    clamped = kerple(name, pe_relative_untie_layers=True)
    set_params(clamped, [[EPS, EPS], [5.0, 0.3]], [[EPS, 7.0 if high is None else high], [EPS, 1.0]])
    for block in (1, 2):
        torch.testing.assert_close(enc.position_bias(5, 5, 0, block), clamped.position_bias(5, 5, 0, block))


PRECISIONS = ["fp32", "fp16", "bf16", "memory-efficient-fp16", "memory-efficient-bf16"]


def test_the_projection_reaches_the_copy_every_fairseq_optimizer_updates(cpu_fp16_optimizer):
    """r₁, r₂ at their bounds, with a gradient that pushes them past: after every update of fairseq's Adam, plain
    or wrapped by FP16Optimizer (--fp16, --bf16: a float32 master copy) or MemoryEfficientFP16Optimizer, the
    parameters are at their bounds, the optimizer's copy equals the model's, and every optimizer gives the same
    values.  Before the fix the master of --fp16/--bf16 drifted past the bound (−0.501, −0.502, ...) while the
    forward pass used the bound."""
    trajectories = {}
    for precision in PRECISIONS:
        model, _ = build_model("--pe-absolute", "none", "--pe-relative", "kerple-power", "--pe-relative-untie-layers")
        if precision != "fp32":
            model = model.to(torch.float16 if "fp16" in precision else torch.bfloat16)
        enc = model.encoder.embed_positions.relative
        with torch.no_grad():
            enc.r1[0, 0] = EPS
            enc.r2[0, 0] = EPS
            enc.r2[1, 1] = 2.0
        optimizer = fairseq_optimizer([p for p in model.parameters() if p.requires_grad], precision)
        trajectory = []
        for _ in range(4):
            optimizer.zero_grad()
            # through the bias −r₁·d^r₂ (d = 1, 2): pushes r₁[0, 0], r₂[0, 0] down and r₂[1, 1] up, past their
            # bounds; the others move freely
            loss = -enc.position_bias(3, 3, 0, 1)[0].sum() + enc.position_bias(3, 3, 0, 2)[1].sum()
            optimizer.backward(loss)
            optimizer.clip_grad_norm(0.0)
            optimizer.step()
            bound = torch.tensor(EPS).item()  # in float32
            assert enc.r1[0, 0].item() == bound and enc.r2[0, 0].item() == bound and enc.r2[1, 1].item() == 2.0, precision
            for param, master in zip((enc.r1, enc.r2), optimizer_masters(optimizer, (enc.r1, enc.r2))):
                assert torch.equal(master.view_as(param), param.detach()), precision
            trajectory.append(torch.cat([enc.r1.detach().flatten(), enc.r2.detach().flatten()]))
        trajectories[precision] = torch.stack(trajectory)
        assert not torch.equal(trajectories[precision][0], trajectories[precision][-1])  # it trained
        torch.testing.assert_close(trajectories[precision], trajectories["fp32"], rtol=1e-6, atol=1e-7,
                                   msg=precision)


def test_initialisation_follows_the_official_code():
    torch.manual_seed(0)
    log, power = (kerple(name, heads=64, blocks=4, pe_relative_untie_layers=True) for name in ("kerple-log", "kerple-power"))
    for enc, (s1, s2) in ((log, (2, 1)), (power, (1, 2))):
        assert EPS <= enc.r1.min() and enc.r1.max() <= s1 and enc.r1.max() > 0.8 * s1
        assert EPS <= enc.r2.min() and enc.r2.max() <= s2 and enc.r2.max() > 0.8 * s2
        assert not torch.equal(enc.r1[0], enc.r1[1])  # per layer, untied


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power"])
def test_shared_by_all_layers_as_the_authors_code(name):
    """chijames/KERPLE hands one rpe_emb module to every layer (megatron/model/gpt2_model.py): r₁, r₂ per head,
    2·H parameters per side (16 for 8 heads, where one pair per layer of 6 layers had 96); --pe-relative-untie-layers
    gives one pair per layer; --pe-relative-untie-heads is refused (per head already)."""
    model, _ = build_model("--pe-absolute", "none", "--pe-relative", name, "--encoder-layers", "6",
                           "--encoder-attention-heads", "8")
    enc = model.encoder.embed_positions.relative
    assert sum(p.numel() for p in enc.parameters()) == 16 and enc.r1.shape == (1, 8)
    torch.testing.assert_close(enc.position_bias(5, 5, 0, 1), enc.position_bias(5, 5, 0, 6))
    untied, _ = build_model("--pe-absolute", "none", "--pe-relative", name, "--encoder-layers", "6",
                            "--encoder-attention-heads", "8", "--pe-relative-untie-layers")
    assert sum(p.numel() for p in untied.encoder.embed_positions.relative.parameters()) == 96
    with pytest.raises(UserError, match="already"):
        build_model("--pe-absolute", "none", "--pe-relative", name, "--pe-relative-untie-heads")


def kerple_parameters(model):
    return [getattr(side.embed_positions.relative, n) for side in (model.encoder, model.decoder) for n in ("r1", "r2")]


def trained_per_layer(name):
    trained, d = build_model("--pe-absolute", "none", "--pe-relative", name, "--pe-relative-untie-layers", seed=3)
    with torch.no_grad():
        for side in (trained.encoder, trained.decoder):
            side.embed_positions.relative.r1.uniform_(0.1, 2.0)  # different per layer
    return trained, d


def assert_same_outputs(model, other, d):
    src, prev = random_tokens(d, 2, 9, left_pad=(0, 3)), random_tokens(d, 2, 6, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(model(src, torch.tensor([9, 6]), prev)[0], other(src, torch.tensor([9, 6]), prev)[0])


def assert_loaded_in_place_and_trained(model, state, d):
    """``model.load_state_dict(state)`` copies into r₁, r₂ of the model, which an optimizer built before the load
    then updates (issue 39, 4c: fairseq's Trainer wraps the model in DDP before it loads a checkpoint)."""
    before = kerple_parameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.load_state_dict(state)
    after = kerple_parameters(model)
    assert [id(p) for p in after] == [id(p) for p in before]
    loaded = [p.detach().clone() for p in after]
    model.train()
    out, _ = model(random_tokens(d, 2, 9), torch.tensor([9, 9]), random_tokens(d, 2, 7, seed=9))
    out.float().pow(2).mean().backward()
    optimizer.step()
    assert all(not torch.equal(p.detach(), value) for p, value in zip(kerple_parameters(model), loaded))
    model.eval()


def built_from_options_saved_by_0_1(name, seed):
    """A model as fairseq builds one from a checkpoint of fairseq-pe 0.1: the options 0.1 saved (its architecture
    function's: pe_sandwich_dim None, no pe_sandwich_first_frequency, no untie flag, which KERPLE refused then),
    upgraded as the checkpoint loader upgrades them (upgrade_saved_options), then the architecture and the model."""
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)  # as fairseq does
    TransformerPEModel.add_args(parser)
    args = parser.parse_args(["--pe-absolute", "none", "--pe-relative", name])
    args.pe_relative_untie_layers, args.pe_sandwich_dim = False, None
    upgrade_saved_options(args)
    ARCH_CONFIG_REGISTRY["transformer_pe_tiny"](args)
    d = dictionary(20)
    torch.manual_seed(seed)
    return TransformerPEModel.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d)).eval()


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power"])
def test_a_checkpoint_of_fairseq_pe_0_1_loads_per_layer_as_trained(name):
    """fairseq-pe 0.1 trained one pair per layer: a model built from the options it saved has a pair per layer
    before it loads, the checkpoint loads into it in place, and it computes what it computed.  Options saved by 0.2
    (pe_sandwich_first_frequency present) keep their layout."""
    trained, d = trained_per_layer(name)
    loaded = built_from_options_saved_by_0_1(name, seed=4)
    assert loaded.encoder.embed_positions.relative.r1.shape == (2, 4)
    assert loaded.decoder.embed_positions.relative.untie_layers
    assert_loaded_in_place_and_trained(loaded, trained.state_dict(), d)
    loaded.load_state_dict(trained.state_dict())
    assert_same_outputs(loaded, trained, d)
    saved_by_0_2 = SimpleNamespace(pe_relative=name, pe_relative_untie_layers=False, pe_sandwich_dim=None,
                                   pe_sandwich_first_frequency=None)
    assert not upgrade_saved_options(saved_by_0_2).pe_relative_untie_layers


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power"])
def test_a_pair_per_layer_into_one_pair_for_all_layers_is_refused_by_name(name):
    """Loading used to replace r₁, r₂ of a model with one pair for all layers by new Parameter objects of the
    checkpoint's shape, which DDP (built first by fairseq's Trainer) did not reduce.  The model keeps its parameters
    and values, and the error names the flag that builds the checkpoint's layout."""
    trained, _ = trained_per_layer(name)
    shared, _ = build_model("--pe-absolute", "none", "--pe-relative", name, seed=4)
    before = kerple_parameters(shared)
    values = [p.detach().clone() for p in before]
    with pytest.raises(UserError, match="one pair per layer.*--pe-relative-untie-layers"):
        shared.load_state_dict(trained.state_dict())
    assert [id(p) for p in kerple_parameters(shared)] == [id(p) for p in before]
    assert all(torch.equal(p, v) for p, v in zip(kerple_parameters(shared), values))


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power"])
def test_one_pair_for_all_layers_loads_into_a_pair_per_layer(name):
    """A checkpoint with one pair for all layers (0.2's default), loaded with --pe-relative-untie-layers (e.g. a
    fine-tuning that unties them): every layer gets that pair, in place, and the model computes what it computed."""
    shared, d = build_model("--pe-absolute", "none", "--pe-relative", name, seed=3)
    untied, _ = build_model("--pe-absolute", "none", "--pe-relative", name, "--pe-relative-untie-layers", seed=4)
    assert_loaded_in_place_and_trained(untied, shared.state_dict(), d)
    untied.load_state_dict(shared.state_dict())
    for side in ("encoder", "decoder"):
        for n in ("r1", "r2"):
            value = getattr(getattr(untied, side).embed_positions.relative, n)
            assert torch.equal(value, getattr(getattr(shared, side).embed_positions.relative, n).expand(2, -1))
    assert_same_outputs(untied, shared, d)


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power"])
def test_a_checkpoint_with_its_models_layout_loads_in_place(name):
    trained, d = trained_per_layer(name)
    again, _ = build_model("--pe-absolute", "none", "--pe-relative", name, "--pe-relative-untie-layers", seed=4)
    assert_loaded_in_place_and_trained(again, trained.state_dict(), d)


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power"])
def test_trained_parameters_reload_exactly(name, tmp_path):
    model, d = build_model("--pe-absolute", "none", "--pe-relative", name)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for step in range(3):
        out, _ = model(random_tokens(d, 2, 9, seed=step), torch.tensor([9, 9]), random_tokens(d, 2, 7, seed=9))
        out.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    again, _ = build_model("--pe-absolute", "none", "--pe-relative", name, seed=5)
    again.load_state_dict(torch.load(path))
    model.eval(), again.eval()
    src, prev = random_tokens(d, 2, 11), random_tokens(d, 2, 6, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(again(src, torch.tensor([11, 11]), prev)[0], model(src, torch.tensor([11, 11]), prev)[0])
