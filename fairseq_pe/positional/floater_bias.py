"""FLOATER's Q/K/V-bias form (Liu et al. 2020, §3.3, Eqs. 12-13).

Changing block n's position vectors from p̃_i (e.g. sinusoidal) to p_i adds a position-
dependent bias to its projections, q_i = W_q(x_i + p̃_i) + b_q + b_{q,i} (Eq. 12), and FLOATER
models that bias directly with the ODE of Eq. (8):

    b_q^(n)(t) = b_q^(n)(0) + ∫_0^t h(τ, b_q^(n)(τ); θ) dτ,     b_{q,i}^(n) = b_q^(n)(i·Δt)   (13)

and likewise for the keys and values.  With h ≡ 0 and b(0) = 0 every bias is zero and the
model is exactly the one it was built on, which is what makes the warm start from a
sinusoidal checkpoint exact (``scripts/warm_start_floater.py``).

:class:`FloaterAttentionBias` holds the initial values b_{q,k,v}^(n)(0) of one kind of
attention in every block (one group of the model's :class:`~.floater.FloaterFlow`, so θ is
shared by its blocks); :func:`install_projection_biases` adds the biases to the outputs of a
fairseq ``MultiheadAttention``'s ``q_proj``/``k_proj``/``v_proj`` through forward hooks, so
the attention module, its parameters and its state-dict keys stay fairseq's.  Queries use the
positions of the attending side; cross-attention keys and values those of the source.
"""

import torch
import torch.nn as nn

from .base import Float32State
from .pass_state import current_pass

QKV = ("q", "k", "v")


class FloaterAttentionBias(Float32State):
    """Initial values b^(n)_{q,k,v}(0), zero-initialised, for ``num_blocks`` blocks."""

    flow = None

    def __init__(self, embed_dim: int, num_blocks: int):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_blocks = num_blocks
        self.num_initial_values = num_blocks * len(QKV)
        self.initial = nn.Parameter(torch.zeros(num_blocks, len(QKV), embed_dim))

    def initial_values(self):
        return self.initial.view(-1, self.embed_dim)

    def states(self, length: int) -> torch.Tensor:
        """(length, n, D): the biases of positions 0 .. length-1, fetched once for the whole forward pass (kept by
        the pass, :class:`~fairseq_pe.positional.pass_state.PositionPass`)."""
        return self.flow.states(self, length)

    def row(self, block: int, index: int) -> int:
        """Which of the initial values serves projection ``index`` of 1-based ``block``."""
        return (block - 1) * len(QKV) + index

    def all_tables(self, states: torch.Tensor, length: int) -> torch.Tensor:
        """(length, n·D): every block's q/k/v biases side by side, of ``states`` (:meth:`states`); a view where
        ``states`` is one (the flow's solution, sliced to this client's values)."""
        return states[:length].flatten(1)

    @staticmethod
    def query_rows() -> slice:
        """The query biases' rows among :meth:`all_tables`'s n per position (one per block)."""
        return slice(0, None, len(QKV))

    def table(self, length: int, block: int, index: int, states=None) -> torch.Tensor:
        """(length × D) biases of projection ``index`` (0 q, 1 k, 2 v) of 1-based ``block``, of the pass's
        ``states`` where they reach ``length``."""
        if states is None or states.size(0) < length:
            states = self.flow.states(self, length)
        return states[:length, self.row(block, index)]


class _ProjectionBias:
    """Forward hook of a q/k/v projection: output (T, B, D) + the position biases."""

    def __init__(self, layer, kind: str, index: int):
        self.layer = layer  # the fairseq layer: knows its block and its position injector
        self.kind = kind
        self.index = index

    def __call__(self, module, inputs, output):
        layer = self.layer
        bias = layer.position_tensor(f"pe_{self.kind}_{self.index}", lambda: layer.position_injector.attention_bias(
            current_pass(), self.kind, layer.block, self.index))
        return output + bias.to(output.dtype)


def install_projection_biases(attention, layer, kind: str):
    """Add FLOATER biases to ``attention``'s q/k/v projections (``kind`` "self" or "cross")."""
    for index, name in enumerate(QKV):
        getattr(attention, f"{name}_proj").register_forward_hook(_ProjectionBias(layer, kind, index))
