"""The three properties of position encodings (Wang et al., "On Position Embeddings in BERT", §2).

A proximity function φ(x, y) between positions x and y is given as an (L × L) matrix ``M`` with
M[x, y] = φ(x, y): the dot product ⟨P_x, P_y⟩ of absolute vectors, their cosine, or the
identical-word attention logit of §3.1.  The paper's properties, as numeric scores:

* **monotonicity** (Property 1, Eq. 2: φ(x, x+m₁) > φ(x, x+m₂) for 0 ≤ m₁ < m₂): (a) the window,
  the largest k such that m ↦ φ(x, x+m) strictly decreases on 0..k, its median over the rows x
  (rightwards; leftwards likewise on x−m); (b) the share of pairs m₁ < m₂ ≤ ``max_offset`` for which Eq. 2 holds,
  over all x with x+m₂ < L.  A strictly decreasing ψ gives windows of L−1−x and a share of 1.
* **translation invariance** (Property 2, Eq. 3: φ(x₁, x₁+m) = φ(x₂, x₂+m)): for each offset m
  (positive and negative) the standard deviation of the diagonal {M[x, x+m]}_x, averaged over m and
  divided by the standard deviation of all of M.  0 for a Toeplitz matrix, and for a constant one
  (up to float32 rounding: ``constant`` in the scores).
* **symmetry** (Property 3: φ(x, y) = φ(y, x)): ‖M − Mᵀ‖_F / ‖M‖_F.  0 for a symmetric matrix.

For fixed frequencies ω the sinusoidal dot product depends on the offset only,
ψ(m) = Σ_i cos(ω_i·m) (App. A), and :func:`psi_decreasing_window` gives how far it decreases.
"""

from typing import Dict

import torch


def proximity(vectors: torch.Tensor, kind: str = "dot") -> torch.Tensor:
    """(L, D) position vectors -> (L, L) matrix of dot products or cosines."""
    v = vectors.double()
    if kind == "cosine":
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    elif kind != "dot":
        raise ValueError(f"kind must be 'dot' or 'cosine', not {kind!r}")
    return v @ v.t()


def is_constant(m: torch.Tensor, rtol: float = 1e-6) -> bool:
    """Whether M is constant up to float32 rounding (e.g. the logits of a model without positions)."""
    m = m.double()
    return bool((m.max() - m.min()) <= rtol * m.abs().max().clamp_min(1e-30))


def translation_invariance(m: torch.Tensor) -> float:
    m = m.double()
    if is_constant(m):
        return 0.0  # the ratio below would only measure rounding noise
    n = m.size(0)
    spread = [m.diagonal(offset).std(unbiased=False) for offset in range(-(n - 2), n - 1)]
    scale = m.std(unbiased=False).clamp_min(1e-12)
    return float(torch.stack(spread).mean() / scale)


def _window(values: torch.Tensor) -> int:
    """Largest k with values[0] > values[1] > ... > values[k]."""
    return int(_row_windows(values.unsqueeze(0), torch.ones_like(values, dtype=torch.bool).unsqueeze(0))[0])


def _row_windows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per row, the largest k with values[0] > ... > values[k], counting only ``valid`` entries
    (a valid prefix of each row)."""
    steps = (values[:, 1:] < values[:, :-1]) & valid[:, 1:]
    return torch.cumprod(steps.long(), dim=1).sum(dim=1)


def _offset_rows(m: torch.Tensor, sign: int):
    """Row x holds φ(x, x + sign·k) for k = 0 .. L-1, with a mask of the k that stay inside."""
    n = m.size(0)
    x = torch.arange(n)[:, None]
    y = x + sign * torch.arange(n)[None]
    valid = (y >= 0) & (y < n)
    return m[x, y.clamp(0, n - 1)], valid


def monotonicity(m: torch.Tensor, max_offset: int = 32) -> Dict[str, float]:
    m = m.double()
    n = m.size(0)
    right = _row_windows(*_offset_rows(m, +1))[:-1].double()  # the last row has no offset to its right
    left = _row_windows(*_offset_rows(m, -1))[1:].double()
    held = total = 0
    span = min(max_offset, n - 1)
    for m1 in range(0, span):
        for m2 in range(m1 + 1, span + 1):
            xs = torch.arange(0, n - m2)
            a, b = m[xs, xs + m1], m[xs, xs + m2]
            held += int((a > b).sum())
            total += xs.numel()
    return {"window_right": float(right.median()), "window_left": float(left.median()),
            "eq2_share": held / total if total else float("nan")}


def symmetry(m: torch.Tensor) -> float:
    m = m.double()
    return float((m - m.t()).norm() / m.norm().clamp_min(1e-12))


def psi(omegas: torch.Tensor, max_offset: int) -> torch.Tensor:
    """ψ(m) = Σ_i cos(ω_i·m) for m = 0 .. max_offset."""
    offsets = torch.arange(max_offset + 1, dtype=torch.float64)
    return torch.cos(offsets[:, None] * omegas.double()[None]).sum(-1)


def psi_decreasing_window(omegas: torch.Tensor, max_offset: int = 1000) -> int:
    """The largest integer m such that ψ strictly decreases on 0..m."""
    return _window(psi(omegas, max_offset))


def property_scores(m: torch.Tensor, max_offset: int = 32) -> Dict[str, float]:
    out = {"translation_invariance": translation_invariance(m), "symmetry": symmetry(m), "constant": is_constant(m)}
    out.update(monotonicity(m, max_offset))
    return out
