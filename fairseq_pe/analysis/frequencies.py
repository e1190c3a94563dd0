"""Learned frequencies of learnable-sinusoidal encodings against their initial values (Wang et
al. 2021, App. A.5, Fig. 6), and the ψ(m) = Σ_i cos(ω_i·m) curve they give.

Both learnable-sinusoidal encodings start from ω_i = 10000^(-2i/D) (D the model dimension for the
APE, the head dimension for the RPE), so the initial values are recomputed, not stored.  With
learned ω the dot product ⟨P(x), P(x+m)⟩ of the APE is still ψ(m): its strictly decreasing
window is the monotonicity window of the encoding itself.
"""

from typing import Dict, List

import torch

from fairseq_pe.positional.relative_vectors import LearnableSinusoidalRelativePositionEncoding
from fairseq_pe.positional.sinusoidal import (FairseqSinusoidalPositionEncoding, FixedSinusoidalPositionEncoding,
                                              LearnableSinusoidalPositionEncoding, fairseq_frequencies,
                                              transformer_frequencies)

from .properties import psi, psi_decreasing_window
from .vectors import side_of

PSI_OFFSETS = 128


def _entry(name: str, learned: torch.Tensor, initial: torch.Tensor, max_offset: int) -> Dict[str, object]:
    learned, initial = learned.detach().double(), initial.double()
    return {
        "name": name,
        "learned": learned.tolist(),
        "initial": initial.tolist(),
        "median_relative_change": float(((learned - initial).abs() / initial).median()),
        "psi_window_learned": psi_decreasing_window(learned),
        "psi_window_initial": psi_decreasing_window(initial),
        "psi_learned": psi(learned, max_offset).tolist(),
        "psi_initial": psi(initial, max_offset).tolist(),
    }


def learned_frequencies(model, max_offset: int = PSI_OFFSETS, side: str = "encoder") -> List[Dict[str, object]]:
    """One entry per set of learnable frequencies of ``side``: the APE's, and the RPE's per layer
    and head when untied.  ψ curves for m = 0 .. ``max_offset``; windows over 0 .. 1000."""
    injector = side_of(model, side).embed_positions
    out = []
    absolute = getattr(injector, "absolute", None)
    if isinstance(absolute, LearnableSinusoidalPositionEncoding):
        out.append(_entry("absolute", absolute.omega, transformer_frequencies(absolute.embed_dim), max_offset))
    relative = getattr(injector, "relative", None)
    if isinstance(relative, LearnableSinusoidalRelativePositionEncoding):
        omega = relative.omega  # (tables, [heads,] d/2)
        initial = transformer_frequencies(relative.head_dim)
        for t in range(omega.size(0)):
            rows = omega[t] if omega.dim() == 3 else omega[t].unsqueeze(0)
            for h, row in enumerate(rows):
                name = "relative" + (f" layer {t + 1}" if omega.size(0) > 1 else "") + \
                    (f" head {h + 1}" if omega.dim() == 3 else "")
                out.append(_entry(name, row, initial, max_offset))
    return out


def fixed_psi_window(model, side: str = "encoder") -> Dict[str, int]:
    """ψ windows of the fixed sinusoids ``side`` uses (the paper's 43 at D = 512/768, 5 at D = 64)."""
    from fairseq.modules import SinusoidalPositionalEmbedding

    injector = side_of(model, side).embed_positions
    out = {}
    if isinstance(getattr(injector, "absolute", None), (FixedSinusoidalPositionEncoding,
                                                        FairseqSinusoidalPositionEncoding)):
        out["absolute"] = psi_decreasing_window(injector.absolute.omega)
    elif isinstance(injector, SinusoidalPositionalEmbedding):  # fairseq's stock sinusoids
        out["absolute"] = psi_decreasing_window(fairseq_frequencies(injector.embedding_dim))
    relative = getattr(injector, "relative", None)
    if relative is not None and getattr(relative, "registry_name", None) == "sinusoidal":
        out["relative"] = psi_decreasing_window(relative.omega)
    return out
