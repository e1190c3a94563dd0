"""What every attention hands to torch's ``scaled_dot_product_attention`` (its arguments decide the CUDA kernel).

* the table of ``docs/speed.md`` is what the code does, for every encoding, padded and unpadded, training and
  evaluation, with the CPU's choices and with CUDA's (``fairseq-pe-sdpa-arguments``);
* decoder self-attention passes ``is_causal=True`` and no mask where its only mask is the causal one, and an
  unpadded source gives the cross-attention no padding mask: both compute what the float masks computed;
* with CUDA's choices (simulated on the CPU), T5, KERPLE and FIRE train through SDPA with a mask that carries the
  gradient, built once per pass and shared by the layers (once per layer under ``--checkpoint-activations``), and
  give the blockwise path's gradients; masks have rows aligned for the memory-efficient kernel.
"""

import os

import pytest
import torch

import fairseq_pe.models.attention as attention_module
from fairseq_pe import systems as catalogue
from fairseq_pe.benchmark import sdpa_arguments
from fairseq_pe.diagnostics.attention_calls import recording
from fairseq_pe.diagnostics.capabilities import as_on_cuda

from helpers import REPO, build_model, cli, random_tokens

@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda-choices"])
def test_the_table_of_speed_md_is_what_each_attention_hands_to_sdpa(cuda):
    with open(os.path.join(REPO, "docs", "speed.md"), encoding="utf-8") as f:
        documented = sdpa_arguments.parse_table(f.read(), cuda)
    measured = sdpa_arguments.measure(list(sdpa_arguments.SYSTEMS), cuda)
    assert sorted(documented) == sorted(measured), "docs/speed.md's table lists other systems"
    for system, settings in measured.items():
        cells = [sdpa_arguments.cell(settings[s]) for s in sdpa_arguments.SETTINGS]
        assert documented[system] == cells, (f"{system}: docs/speed.md says {documented[system]}, the code hands SDPA "
                                            f"{cells}; regenerate with fairseq-pe-sdpa-arguments"
                                            f"{' --cuda-choices' if cuda else ''}")


def test_the_table_shows_the_kernels_arguments():
    """The codes themselves (not only their agreement with the page): FlashAttention's arguments where nothing is
    masked but the future, a shared (1, H, T, S) bias where the batch is unpadded."""
    measured = sdpa_arguments.measure(["ape-sinusoidal", "alibi", "t5"])
    assert measured["ape-sinusoidal"][("unpadded", "train")] == {"encoder-self": "none", "decoder-self": "causal",
                                                                 "cross": "none + fairseq"}
    assert measured["alibi"][("unpadded", "eval")]["decoder-self"] == "mask 1HTS"
    assert measured["t5"][("unpadded", "train")]["encoder-self"] == "blockwise"  # CPU: the mask's gradient


def test_the_console_script_prints_the_rows_of_speed_md():
    """fairseq-pe-sdpa-arguments (tests/fresh_subset.py runs it as a new interpreter, through its installed wrapper):
    the table's header and each system's row as docs/speed.md has them."""
    with open(os.path.join(REPO, "docs", "speed.md"), encoding="utf-8") as f:
        documented = sdpa_arguments.parse_table(f.read())
    proc = cli("fairseq-pe-sdpa-arguments", "--systems", "ape-sinusoidal", "t5")
    assert sdpa_arguments.parse_table(proc.stdout) == {name: documented[name] for name in ("ape-sinusoidal", "t5")}


def cuda_choices(model):
    """The attention's capabilities of SDPA's masks answered as on CUDA for the block (FlexAttention's stay the CPU's:
    its forward only)."""
    return as_on_cuda(model, only=("mask_gradient_fused", "aligned_rows"))


def train_pass(model, d, src, tgt):
    """Loss gradients of one training forward/backward of the whole model (no dropout)."""
    model.train()
    model.zero_grad()
    lengths = src.ne(d.pad()).sum(1)
    out, _ = model(src, lengths, tgt)
    out.float().pow(2).mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


BIASED = {name: catalogue.flags(name) for name in ("t5", "kerple-power", "fire", "alibi")}


@pytest.mark.parametrize("checkpointed", [False, True], ids=["", "checkpoint-activations"])
@pytest.mark.parametrize("name", list(BIASED))
def test_cuda_choices_train_fused_with_the_blockwise_gradients(name, checkpointed, monkeypatch):
    flags = [*BIASED[name], "--dropout", "0", "--attention-dropout", "0",
             "--encoder-layers", "3", "--decoder-layers", "3"] + (["--checkpoint-activations"] if checkpointed else [])
    model, d = build_model(*flags)
    plain = build_model(*[f for f in flags if f != "--checkpoint-activations"])[0]  # the same parameters
    for padded in (False, True):
        src = random_tokens(d, 3, 13, seed=1, left_pad=(0, 3, 5) if padded else ())
        tgt = random_tokens(d, 3, 9, seed=2)
        if padded:
            tgt[2, 6:] = d.pad()
        reference = train_pass(plain, d, src, tgt)  # the CPU's choice: blockwise for a bias with a gradient
        if checkpointed:  # the CPU's choice under --checkpoint-activations too
            cpu = train_pass(model, d, src, tgt)
            for key in reference[1]:
                torch.testing.assert_close(cpu[1][key], reference[1][key], rtol=1e-4, atol=1e-6, msg=key)
        with monkeypatch.context() as patch, cuda_choices(model):
            builds = []
            relative = model.encoder.embed_positions.relative
            original = type(relative).position_bias

            def counted(self, *args, **kwargs):
                builds.append(self.causal)
                return original(self, *args, **kwargs)

            patch.setattr(type(relative), "position_bias", counted)
            with recording(model) as calls:
                fused = train_pass(model, d, src, tgt)
        self_calls = [c for c in calls if c.role != "cross"]
        assert self_calls and all(c.path == "fused" for c in self_calls)
        learned = name != "alibi"
        # (checkpointed: fairseq's forward runs without autograd, the recomputation in backward with it)
        with_gradient = [c.mask_requires_grad for c in self_calls]
        assert (any(with_gradient) if checkpointed else all(with_gradient)) == learned
        assert all(c.mask_aligned(attention_module.MASK_ALIGNMENT) for c in calls)
        # built once per pass and side; checkpointed, once in the forward pass (without autograd) and, in backward,
        # once per layer's recomputation (a learned bias: each recomputation has a graph of its own) or once
        per_side = {side: builds.count(side) for side in (False, True)}
        expected = (1 + (3 if learned else 1)) if checkpointed else 1
        assert per_side == {False: expected, True: expected}, per_side
        torch.testing.assert_close(fused[0], reference[0], rtol=1e-5, atol=1e-5)
        assert fused[1].keys() == reference[1].keys()
        for key in reference[1]:
            torch.testing.assert_close(fused[1][key], reference[1][key], rtol=1e-4, atol=1e-6, msg=key)


def test_aligned_masks_hold_the_same_values():
    bias = torch.randn(4, 5, 13)
    plain = attention_module.merged_mask(None, torch.tensor([[False] * 10 + [True] * 3] * 2), bias, 2, 5, 13,
                                         torch.float16)
    aligned = attention_module.merged_mask(None, torch.tensor([[False] * 10 + [True] * 3] * 2), bias, 2, 5, 13,
                                           torch.float16, aligned=True)
    assert aligned.shape == plain.shape == (2, 4, 5, 13) and aligned.dtype == torch.float16
    assert aligned.stride(-1) == 1 and aligned.stride(-2) == 16 and aligned.stride(1) % 16 == 0
    assert torch.equal(aligned, plain)


@pytest.mark.parametrize("system", [["--pe-absolute", "sinusoidal"], ["--pe-relative", "rope"],
                                    ["--pe-relative", "alibi"]], ids=["ape", "rope", "alibi"])
def test_causal_kernel_and_no_padding_mask_compute_what_the_masks_did(system, monkeypatch):
    """The decoder's is_causal and the unpadded source's missing cross-attention mask give, to rounding, the
    outputs of the float masks they replace (forced back by making the source look padded)."""
    model, d = build_model(*system, "--dropout", "0")
    src, tgt = random_tokens(d, 3, 11, seed=3), random_tokens(d, 3, 7, seed=4)
    lengths = torch.full((3,), 11)
    encoder_out = model.encoder(src, lengths)
    assert encoder_out["encoder_padding_mask"] == []  # nothing padded: no mask for the cross-attention
    with recording(model) as calls:
        new, _ = model.decoder(tgt, encoder_out=encoder_out)
    decoder_self = [c for c in calls if c.role == "decoder-self"]
    assert decoder_self and all(c.is_causal == (system[1] != "alibi") for c in decoder_self)
    assert all(c.mask_shape is None for c in calls if c.role == "cross" and c.path == "fused")
    # the float masks: the all-False padding mask fairseq returns, and the future mask as a float tensor
    encoder_out["encoder_padding_mask"] = [src.eq(d.pad())]
    monkeypatch.setattr(attention_module.PositionAttention, "future_masked", False, raising=False)
    for layer in model.decoder.layers:
        layer.self_attn.future_masked = False
    old, _ = model.decoder(tgt, encoder_out=encoder_out)
    torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-5)
    padded = random_tokens(d, 3, 11, seed=3, left_pad=(0, 2))
    assert len(model.encoder(padded, padded.ne(d.pad()).sum(1))["encoder_padding_mask"]) == 1
