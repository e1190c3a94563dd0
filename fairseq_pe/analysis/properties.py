"""The three properties of position encodings (Wang et al., "On Position Embeddings in BERT", §2).

A proximity function φ(x, y) between positions x and y is given as an (L × L) matrix ``M`` with
M[x, y] = φ(x, y): the dot product ⟨P_x, P_y⟩ of absolute vectors, their cosine, or the
identical-word attention logit of §3.1.  Entries that do not exist are NaN: a decoder's query x
never sees a key y > x, so its logits are NaN above the diagonal and every score below is taken
over the entries that exist.  The paper's properties, as numeric scores:

* **monotonicity** (Property 1, Eq. 2: φ(x, x+m₁) > φ(x, x+m₂) for 0 ≤ m₁ < m₂): (a) the window,
  the largest k such that m ↦ φ(x, x+m) strictly decreases on 0..k, its median over the rows x
  (rightwards; leftwards likewise on x−m); (b) the share of pairs m₁ < m₂ ≤ ``max_offset`` for which
  Eq. 2 holds, over all x, rightwards (x+m) and leftwards (x−m): Eq. 1 for pairs on one side of x.
  A strictly decreasing ψ gives windows of L−1−x and a share of 1; noise gives a share of about ½.
* **translation invariance** (Property 2, Eq. 3: φ(x₁, x₁+m) = φ(x₂, x₂+m)): for each offset m
  (positive and negative) the standard deviation of the diagonal {M[x, x+m]}_x, averaged over m and
  divided by the standard deviation of all of M.  0 for a Toeplitz matrix, and for a constant one
  (up to float32 rounding: ``constant`` in the scores).
* **symmetry** (Property 3: φ(x, y) = φ(y, x)): ‖M − Mᵀ‖_F / ‖M‖_F.  0 for a symmetric matrix.
  A Gram matrix (dot products or cosines of vectors) is symmetric by construction, so it gets
  ``None`` (``gram=True``).  Relative vectors are judged instead by how the vector of a distance r
  differs from that of −r: :func:`direction_asymmetry`, ‖a_r − a_{−r}‖_F / ‖a‖_F over r ≠ 0
  (0 when forward and backward distances share a vector; Table 1's × for RPEs).

A score that has no entry to be computed on (leftward windows of a causal matrix are fine,
rightward ones and symmetry are not) is ``None``.

For fixed frequencies ω the sinusoidal dot product depends on the offset only,
ψ(m) = Σ_i cos(ω_i·m) (App. A), and :func:`psi_decreasing_window` gives how far it decreases.
"""

from typing import Dict, Optional

import torch


def proximity(vectors: torch.Tensor, kind: str = "dot") -> torch.Tensor:
    """(L, D) position vectors -> (L, L) matrix of dot products or cosines."""
    v = vectors.double()
    if kind == "cosine":
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    elif kind != "dot":
        raise ValueError(f"kind must be 'dot' or 'cosine', not {kind!r}")
    return v @ v.t()


def causal(m: torch.Tensor) -> torch.Tensor:
    """M with the entries above the diagonal (keys after the query) set to NaN."""
    m = m.double().clone()
    n = m.size(-1)
    m[..., torch.ones(n, n, dtype=torch.bool).triu(1)] = float("nan")
    return m


def _std(values: torch.Tensor) -> torch.Tensor:
    values = values[~values.isnan()]
    return values.std(unbiased=False) if values.numel() else values.new_tensor(float("nan"))


def is_constant(m: torch.Tensor, rtol: float = 1e-6) -> bool:
    """Whether M is constant up to float32 rounding (e.g. the logits of a model without positions)."""
    m = m.double()
    m = m[~m.isnan()]
    return bool((m.max() - m.min()) <= rtol * m.abs().max().clamp_min(1e-30))


def translation_invariance(m: torch.Tensor) -> float:
    m = m.double()
    if is_constant(m):
        return 0.0  # the ratio below would only measure rounding noise
    n = m.size(0)
    spread = [_std(m.diagonal(offset)) for offset in range(-(n - 2), n - 1)]
    spread = torch.stack([s for s in spread if not s.isnan()])
    return float(spread.mean() / _std(m).clamp_min(1e-12))


def _row_windows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per row, the largest k with values[0] > ... > values[k], counting only ``valid`` entries
    (a valid prefix of each row)."""
    steps = (values[:, 1:] < values[:, :-1]) & valid[:, 1:]
    return torch.cumprod(steps.long(), dim=1).sum(dim=1)


def _window(values: torch.Tensor) -> int:
    """Largest k with values[0] > values[1] > ... > values[k]."""
    return int(_row_windows(values.unsqueeze(0), torch.ones_like(values, dtype=torch.bool).unsqueeze(0))[0])


def _offset_rows(m: torch.Tensor, sign: int):
    """Row x holds φ(x, x + sign·k) for k = 0 .. L-1, with a mask of the k that exist."""
    n = m.size(0)
    x = torch.arange(n)[:, None]
    y = x + sign * torch.arange(n)[None]
    inside = (y >= 0) & (y < n)
    values = m[x, y.clamp(0, n - 1)]
    return values, inside & ~values.isnan()


def _median_window(values: torch.Tensor, valid: torch.Tensor) -> Optional[float]:
    has_offset = valid[:, 0] & valid[:, 1]  # rows with φ(x, x) and a first neighbour on this side
    if not bool(has_offset.any()):
        return None
    return float(_row_windows(values, valid)[has_offset].double().median())


def monotonicity(m: torch.Tensor, max_offset: int = 32) -> Dict[str, Optional[float]]:
    m = m.double()
    span = min(max_offset, m.size(0) - 1)
    pairs = torch.ones(span + 1, span + 1, dtype=torch.bool).triu(1)  # offsets m1 < m2 <= span
    windows, held, total = {}, 0, 0
    for sign, name in ((+1, "window_right"), (-1, "window_left")):
        values, valid = _offset_rows(m, sign)
        windows[name] = _median_window(values, valid)
        v, ok = values[:, :span + 1], valid[:, :span + 1]
        both = ok[:, :, None] & ok[:, None, :] & pairs  # (x, m1, m2) with both entries
        held += int(((v[:, :, None] > v[:, None, :]) & both).sum())
        total += int(both.sum())
    return {**windows, "eq2_share": held / total if total else None}


def symmetry(m: torch.Tensor) -> Optional[float]:
    m = m.double()
    both = ~(m.isnan() | m.t().isnan())
    if not bool((both & ~torch.eye(m.size(0), dtype=torch.bool)).any()):
        return None  # a causal matrix: no pair (x, y), x ≠ y, with both entries
    a, b = m[both], m.t()[both]
    return float((a - b).norm() / a.norm().clamp_min(1e-12))


def direction_asymmetry(vectors: torch.Tensor) -> float:
    """Relative vectors (…, 2K+1, d), index r + K for r = −K..K -> ‖a_r − a_{−r}‖_F / ‖a‖_F, r ≠ 0."""
    v = vectors.double()
    k = (v.size(-2) - 1) // 2
    forward, backward = v[..., k + 1:, :], v[..., :k, :].flip(-2)
    return float((forward - backward).norm() / v.norm().clamp_min(1e-12))


def psi(omegas: torch.Tensor, max_offset: int) -> torch.Tensor:
    """ψ(m) = Σ_i cos(ω_i·m) for m = 0 .. max_offset."""
    offsets = torch.arange(max_offset + 1, dtype=torch.float64)
    return torch.cos(offsets[:, None] * omegas.double()[None]).sum(-1)


def psi_decreasing_window(omegas: torch.Tensor, max_offset: int = 1000) -> int:
    """The largest integer m such that ψ strictly decreases on 0..m."""
    return _window(psi(omegas, max_offset))


def property_scores(m: torch.Tensor, max_offset: int = 32, gram: bool = False) -> Dict[str, object]:
    """The scores of the module docstring; ``gram``: M is a Gram matrix (symmetry is then ``None``)."""
    if max_offset < 1:
        raise ValueError(f"max_offset must be >= 1, got {max_offset}")
    out = {"translation_invariance": translation_invariance(m), "symmetry": None if gram else symmetry(m),
           "constant": is_constant(m), "max_offset_used": min(max_offset, m.size(0) - 1)}
    out.update(monotonicity(m, max_offset))
    return out
