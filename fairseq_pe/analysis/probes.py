"""The position regression probe (Wang & Chen 2020, "What do position embeddings learn?", §3):
a linear regression from position vectors to position indices, fitted on the even positions and
tested on the odd ones; the error per position says how much absolute position a vector carries.

Fitted with scikit-learn's ``LinearRegression`` (ordinary least squares with an intercept; the
minimum-norm solution when there are more dimensions than training positions).
"""

from typing import Dict

import torch
from sklearn.linear_model import LinearRegression


def regression_probe(vectors: torch.Tensor) -> Dict[str, object]:
    """``vectors`` (L, D) -> {"mean_abs_error", "max_abs_error", "exact_share", "errors" (per odd position)}."""
    v = vectors.double()
    n = v.size(0)
    if n < 4:
        raise ValueError("the probe needs at least 4 positions")
    x = v.numpy()
    y = torch.arange(n, dtype=torch.float64)
    fit = LinearRegression().fit(x[0::2], y[0::2].numpy())
    pred = torch.from_numpy(fit.predict(x[1::2]))
    errors = (pred - y[1::2]).abs()
    return {"mean_abs_error": float(errors.mean()), "max_abs_error": float(errors.max()),
            "exact_share": float((pred.round() == y[1::2]).double().mean()), "errors": errors.tolist()}
