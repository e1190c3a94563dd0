"""KERPLE (Chi et al. 2022, "Kernelized Relative Positional Embedding for Length Extrapolation"), §4:
a logit bias per head from a conditionally positive definite kernel of the distance,

    kerple-log:    logits_ij += −r₁·log(1 + r₂·|i − j|)        (Eq. 8, the "logarithmic variant")
    kerple-power:  logits_ij += −r₁·|i − j|^r₂,  0 < r₂ ≤ 2     (Eq. 7, the "power variant")

with r₁, r₂ > 0 learned for every head and shared by all layers, as the authors' code does (chijames/KERPLE,
``megatron/model/gpt2_model.py``: one ``ParallelKerplePower``/``ParallelKerpleLog`` module, ``rpe_emb``, is handed to
every transformer layer: 2·H parameters per side); ``--pe-relative-untie-layers`` gives every layer its own.
Checkpoints of fairseq-pe before 0.2 were trained with one pair per layer: a model built from their options has one
pair per layer (:func:`~fairseq_pe.models.options.upgrade_saved_options`) and computes what they computed.
Loading copies into the model's own r₁, r₂ and never replaces them (:meth:`_Kerple._load_from_state_dict`).
Positivity is kept as the official code keeps it, by projection after each update: r₁, r₂ into [ε, ∞), and r₂ of
the power variant into [ε, 2], ε = 0.01 (a projected-gradient step; the official code's
``param.data = param.data.clamp(...)``).  The projection is applied to the copy the optimizer
updates, also fairseq's float32 master copy under ``--fp16``/``--bf16`` (:func:`~.base.constrain`), so the
values stored, used and updated agree under every optimizer.  The forward pass uses the parameters clamped
into the same ranges (the identity after a projection; a guard for values set by other means, e.g. an
optimizer of another library).  Initialisation as the official code:
the log variant's r₁ ~ U(0, 2) and r₂ ~ U(0, 1); the power variant's r₁ ~ U(0, 1) and r₂ ~ U(0, 2)
(both then projected).

|i − j| makes the bias symmetric in the encoder; in the decoder the causal mask leaves j ≤ i, the
paper's causal form.  No length limit.
"""

import logging

import torch
import torch.nn as nn

from fairseq_pe.errors import UserError

from .base import Float32State, RelativePositionEncoding, constrain, register_position_encoding
from .pass_state import BiasKey, as_rows

logger = logging.getLogger(__name__)

EPS = 0.01
POWER_MAX = 2.0


class _Kerple(Float32State, RelativePositionEncoding):
    """r₁, r₂ of shape (1, heads), or (layers, heads) with ``--pe-relative-untie-layers``; subclasses define
    :meth:`kernel`."""

    untiable = ("layers",)
    already_untied = ("heads",)  # per head, as in the paper
    #: the largest r₂ (the power variant's exponent is at most 2; the log variant's r₂ is unbounded)
    r2_max = None
    #: U(0, scale) initialisation of r₁ and r₂ (the official code's)
    init_scales = (1.0, 1.0)

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        self.untie_layers = bool(getattr(args, "pe_relative_untie_layers", False))
        tables = num_blocks if self.untie_layers else 1
        self.r1 = constrain(nn.Parameter(torch.rand(tables, num_heads) * self.init_scales[0]), EPS)
        self.r2 = constrain(nn.Parameter(torch.rand(tables, num_heads) * self.init_scales[1]), EPS, self.r2_max)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Copies into the model's own r₁, r₂ (torch's in-place copy), never new Parameter objects: fairseq's Trainer
        wraps the model in DDP (and an optimizer may exist) before it loads a checkpoint, and a replaced parameter
        would be trained without being reduced.  A checkpoint with one pair for all layers loads into a model with a
        pair per layer as that pair in every layer (it computes the same); one with a pair per layer into a model with
        one pair for all is refused, naming the flag that builds its layout."""
        for name in ("r1", "r2"):
            key, own = prefix + name, getattr(self, name)
            stored = state_dict.get(key)
            if stored is None or stored.dim() != 2 or stored.shape == own.shape or stored.size(1) != own.size(1):
                continue  # as it is, or torch's own size-mismatch error
            if stored.size(0) == 1 and self.untie_layers:
                logger.info(f"{key}: one pair for all layers in the checkpoint, loaded as the pair of every layer")
                state_dict = {**state_dict, key: stored.expand_as(own)}
            elif stored.size(0) == self.num_blocks and not self.untie_layers:
                raise UserError(
                    f"{key}: the checkpoint has KERPLE's r₁, r₂ with one pair per layer ({self.num_blocks} layers; "
                    "fairseq-pe before 0.2 trained them so), the model one pair for all layers: build the model with "
                    "--pe-relative-untie-layers (add it to the command line that resumes or fine-tunes this "
                    "checkpoint)")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    @property
    def bias_requires_grad(self) -> bool:
        return self.r1.requires_grad or self.r2.requires_grad

    def bias_key(self, block):
        return block if self.untie_layers else 0

    def parameters_in_range(self, block: int):
        """r₁, r₂ of ``block`` (H each) as the forward pass uses them: clamped into their ranges (no host sync)."""
        index = self.bias_key(block) - 1 if self.untie_layers else 0
        return self.r1[index].clamp(min=EPS), self.r2[index].clamp(min=EPS, max=self.r2_max)

    def kernel(self, distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def position_bias(self, tgt_len, src_len, query_offset, block, rows=None):
        """(H, T, S) biases, from the T + S − 1 distinct distances (a Toeplitz view, as T5's); (B, H, T, S) from
        the rows' own positions when they have them."""
        rows = as_rows(rows)
        return rows.shared(BiasKey(tgt_len, src_len, query_offset, self.bias_key(block), rows.positions is not None),
                           lambda: self._bias(tgt_len, src_len, query_offset, block, rows))

    toeplitz = True

    def bias_of_distances(self, distances, block):
        r1, r2 = self.parameters_in_range(block)
        shape = (-1,) + (1,) * distances.dim()
        return self.kernel(distances.abs().to(r1.dtype).unsqueeze(0), r1.view(shape), r2.view(shape))

    def _bias(self, tgt_len, src_len, query_offset, block, rows):
        distances = rows.distances(tgt_len, src_len, query_offset)
        if distances is not None:  # the rows' own positions (randomised): (B, H, T, S)
            return self.bias_of_distances(distances, block).transpose(0, 1)
        return self.toeplitz_bias(tgt_len, src_len, query_offset, block, rows)  # [h, i, j] = k(|j − (offset + i)|)


@register_position_encoding("relative", "kerple-log")
class KerpleLogBias(_Kerple):
    """−r₁·log(1 + r₂·|i − j|) (module docstring)."""

    init_scales = (2.0, 1.0)

    def kernel(self, distance, r1, r2):
        return -r1 * torch.log1p(r2 * distance)


@register_position_encoding("relative", "kerple-power")
class KerplePowerBias(_Kerple):
    """−r₁·|i − j|^r₂ with r₂ ≤ 2 (module docstring)."""

    init_scales = (1.0, 2.0)
    r2_max = POWER_MAX

    def kernel(self, distance, r1, r2):
        return -r1 * distance.pow(r2)
