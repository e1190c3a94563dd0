"""Nothing of a pass outlives it (issue 40, section 1): after a forward (evaluation, a training forward and backward,
a step of step-by-step decoding) no module of the model references a tensor other than its registered parameters
and buffers.  The issue measured 41 MiB of one evaluation pass's tensors still held by the modules of
``transformer_pe_tiny`` with T5 (the pass's merged masks and biases, its positions, FLOATER's rows)."""

import pytest
import torch

from helpers import ALL_ENCODINGS, build_model, random_tokens
from passes import leftover_tensors

CASES = {
    "t5": ALL_ENCODINGS["t5"],
    "rope": ALL_ENCODINGS["rope"],
    "fire": ALL_ENCODINGS["fire"],
    "floater": ALL_ENCODINGS["floater"],
    "floater-bias": ALL_ENCODINGS["floater-bias"],
    "random-rope": ALL_ENCODINGS["rope"] + ["--pe-random-positions", "64"],
    "t5-checkpointed": ALL_ENCODINGS["t5"] + ["--checkpoint-activations"],
}


def _batch(d):
    src = random_tokens(d, 2, 12, left_pad=(0, 3))
    prev = random_tokens(d, 2, 7, seed=1)
    return src, torch.tensor([12, 9]), prev


@pytest.mark.parametrize("name", CASES)
def test_no_module_holds_a_tensor_of_an_evaluation_pass(name):
    model, d = build_model(*CASES[name])
    src, lengths, prev = _batch(d)
    with torch.no_grad():
        model(src, lengths, prev)
    assert leftover_tensors(model) == {}


@pytest.mark.parametrize("name", CASES)
def test_no_module_holds_a_tensor_of_a_training_step(name):
    model, d = build_model(*CASES[name])
    model.train()
    src, lengths, prev = _batch(d)
    out = model(src, lengths, prev)
    model.get_normalized_probs(out, log_probs=True).sum().backward()
    del out
    assert leftover_tensors(model) == {}


@pytest.mark.parametrize("name", ["t5", "fire", "floater-bias"])
def test_no_module_holds_a_tensor_of_a_decoding_step(name):
    """Step-by-step decoding keeps what must survive a step in fairseq's ``incremental_state`` (the caller's)."""
    model, d = build_model(*CASES[name])
    src, lengths, prev = _batch(d)
    state = {}
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        for t in range(3):
            model.decoder(prev[:, :t + 1], encoder_out=enc, incremental_state=state)
    assert leftover_tensors(model) == {}


def test_the_walk_sees_a_tensor_left_on_a_module():
    """The check itself: a tensor parked on a module (in an attribute, a dict, a hook's object) is reported."""
    model, _ = build_model(*CASES["t5"])
    layer = model.encoder.layers[0]
    layer.parked = {"mask": [torch.zeros(3)]}
    assert leftover_tensors(model) == {"encoder.layers.0.parked['mask'][0]": 12}


def test_a_model_is_deep_copied_after_a_forward_whose_graph_is_alive():
    """fairseq's EMA (``--store-ema``) deep-copies the model after a training forward: no tensor of the pass, which
    carries a graph (and cannot be deep-copied), is reachable from the model."""
    import copy

    model, d = build_model(*CASES["floater-bias"])
    model.train()
    src, lengths, prev = _batch(d)
    out = model(src, lengths, prev)[0]
    copied = copy.deepcopy(model)
    assert out.requires_grad and leftover_tensors(copied) == {}
