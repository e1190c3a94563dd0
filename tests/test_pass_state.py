"""Per-pass state that could go stale (issue 39 4d): what the layers read of a pass is that pass's, whatever ran
before it (a decoder call without ``encoder_out``), after it (a second forward before the backward of activation
checkpointing), or beside it (``nn.DataParallel``'s replicas, refused by name)."""

import importlib

import pytest
import torch

from fairseq_pe.errors import UserError

from helpers import ALL_ENCODINGS, RANDOMISABLE, build_model, random_tokens
from passes import leftover_tensors, recorded_passes


def test_a_decoder_call_without_encoder_out_does_not_reuse_the_last_sources_lengths():
    """Spaced evaluation spaces the target on its source's length: a decoder call without ``encoder_out`` has none,
    and is refused by name, also after a call that had one (it read that earlier batch's lengths)."""
    model, d = build_model("--pe-random-positions", "64", overrides={"pe_random_eval_decoder": "spaced"})
    src, prev = random_tokens(d, 2, 9), random_tokens(d, 2, 5, seed=1)
    with torch.no_grad():
        with pytest.raises(UserError, match="--pe-random-eval-decoder spaced needs the source"):
            model.decoder(prev)
        model(src, torch.tensor([9, 9]), prev)  # sets the source's lengths for this pass
        with pytest.raises(UserError, match="--pe-random-eval-decoder spaced needs the source"):
            model.decoder(prev)
        # and a later pass with a source is spaced on its own source
        with recorded_passes(model.decoder.embed_positions) as passes:
            model(src[:, :4], torch.tensor([4, 4]), prev)
        assert passes[-1].positions[0].tolist() == [12, 25, 38, 51, 52]  # ⌊(t+1)·65/5⌋ − 1


@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpoint-activations"])
def test_a_decoder_only_call_with_floaters_cross_attention_biases_keeps_nothing_of_the_last_source(checkpoint):
    """FLOATER's cross-attention biases live on the source's positions: a decoder call without ``encoder_out`` runs
    no cross-attention and computes them for no source (with activation checkpointing they are the checkpointed call's
    inputs), and gives what the same call gives on a model that never saw a source."""
    flags = ("--pe-absolute", "none", "--pe-floater-bias", *(["--checkpoint-activations"] if checkpoint else []))
    model, d = build_model(*flags)
    fresh, _ = build_model(*flags)
    src, prev = random_tokens(d, 2, 11), random_tokens(d, 2, 5, seed=1)
    model.train()
    fresh.train()
    model(src, torch.tensor([11, 11]), prev)
    torch.manual_seed(3)
    with recorded_passes(model.decoder.embed_positions) as passes:
        out = model.decoder(prev)[0]
    assert passes[-1].source is None and "cross" not in passes[-1].floater_rows and leftover_tensors(model) == {}
    torch.manual_seed(3)
    torch.testing.assert_close(out, fresh.decoder(prev)[0], rtol=0, atol=0)


def _gradients_of_two_passes_then_one_backward(flags, checkpoint: bool):
    model, d = build_model(*flags, "--dropout", "0", *(["--checkpoint-activations"] if checkpoint else []))
    model.train()
    torch.manual_seed(7)  # the same draws of positions in both models
    losses = []
    for seed in (1, 2):
        src, prev = random_tokens(d, 3, 10, seed=seed, left_pad=(0, 3)), random_tokens(d, 3, 6, seed=seed + 10)
        out = model(src, torch.tensor([10, 7, 10]), prev)
        losses.append(model.get_normalized_probs(out, log_probs=True)[..., 5].sum())
    (losses[0] + 2 * losses[1]).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", RANDOMISABLE)
def test_activation_checkpointing_recomputes_each_pass_with_its_own_random_positions(name):
    """--checkpoint-activations recomputes every layer's forward in the backward: with two forwards before one
    backward (e.g. two losses summed), the first pass's layers are recomputed after the second pass drew its own
    positions, and must still see the first's.  The gradients equal those without checkpointing."""
    flags = (*ALL_ENCODINGS[name], "--pe-random-positions", "64")
    plain = _gradients_of_two_passes_then_one_backward(flags, checkpoint=False)
    checkpointed = _gradients_of_two_passes_then_one_backward(flags, checkpoint=True)
    assert plain.keys() == checkpointed.keys() and len(plain) > 10
    # the same up to float32 rounding (the recomputation may take another attention kernel): within 1e-5 of the
    # largest gradient (some are 0 up to rounding: the keys' bias, which softmax does not see)
    scale = max(float(g.abs().max()) for g in plain.values())
    for key in plain:
        torch.testing.assert_close(checkpointed[key], plain[key], rtol=0, atol=1e-5 * scale, msg=key)


def _replicate_on_the_cpu(module, copies: int, monkeypatch):
    """torch's own ``replicate`` (what ``nn.DataParallel`` calls on two or more GPUs), made to run on the CPU: its
    broadcast of the parameters to the devices hands every replica the parameters themselves."""
    replicate = importlib.import_module("torch.nn.parallel.replicate")
    monkeypatch.setattr(replicate, "_broadcast_coalesced_reshape",
                        lambda tensors, devices, detach=False: [list(tensors) for _ in devices])
    monkeypatch.setattr(replicate, "_get_device_index", lambda device, optional=False: 0)
    return replicate.replicate(module, [0] * copies)


@pytest.mark.parametrize("name", ["ape-learned", "rope", "floater-bias"])
def test_data_parallel_replicas_are_refused_by_name(name, monkeypatch):
    """``nn.DataParallel`` on two or more GPUs runs shallow copies of the model in threads: their layers would reach
    the position state of the pass under way through plain references to the original's encodings (so every replica
    would read, and race on, one pass's positions).  Replicating a model is refused by name; fairseq's own data
    parallelism (DDP: a process per GPU, its own model each) is unaffected, and so is ``nn.DataParallel`` on one
    device or none, which runs the model itself."""
    flags = ALL_ENCODINGS.get(name, ["--pe-absolute", "none", "--pe-floater-bias"])
    model, d = build_model(*flags)
    with pytest.raises(UserError, match=r"nn\.DataParallel.*DistributedDataParallel"):
        _replicate_on_the_cpu(model, 2, monkeypatch)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model = model.to(device)
    src, prev, lengths = random_tokens(d, 2, 6).to(device), random_tokens(d, 2, 4, seed=1).to(device), \
        torch.tensor([6, 6], device=device)
    parallel = torch.nn.DataParallel(model, device_ids=[0] if device.type == "cuda" else [])
    with torch.no_grad():
        torch.testing.assert_close(parallel(src, lengths, prev)[0], model(src, lengths, prev)[0])
