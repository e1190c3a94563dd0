"""The position regression probe (Wang & Chen 2020, "What do position embeddings learn?", §3):
a linear regression from position vectors to position indices, fitted on the even positions and
tested on the odd ones; the error per position says how much absolute position a vector carries.

Fitted by least squares with a bias (``torch.linalg.lstsq``); ``ridge`` adds λ‖W‖² for tables
with more dimensions than training positions.
"""

from typing import Dict

import torch


def regression_probe(vectors: torch.Tensor, ridge: float = 0.0) -> Dict[str, object]:
    """``vectors`` (L, D) -> {"mean_abs_error", "max_abs_error", "exact_share", "errors" (per odd position)}."""
    v = vectors.double()
    n = v.size(0)
    if n < 4:
        raise ValueError("the probe needs at least 4 positions")
    x = torch.cat([v, torch.ones(n, 1, dtype=v.dtype)], dim=1)
    y = torch.arange(n, dtype=v.dtype)
    train, test = x[0::2], x[1::2]
    if ridge > 0:
        a = train.t() @ train + ridge * torch.eye(x.size(1), dtype=v.dtype)
        w = torch.linalg.solve(a, train.t() @ y[0::2])
    else:
        w = torch.linalg.lstsq(train, y[0::2].unsqueeze(1), driver="gelsd").solution.squeeze(1)  # min-norm (SVD)
    pred = test @ w
    errors = (pred - y[1::2]).abs()
    return {"mean_abs_error": float(errors.mean()), "max_abs_error": float(errors.max()),
            "exact_share": float((pred.round() == y[1::2]).double().mean()), "errors": errors.tolist()}
