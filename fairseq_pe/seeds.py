"""Scores over several training seeds: the mean and the sample standard deviation of each.

A ranking of encodings holds only when it holds across training runs: floating-point differences
between machines move a small model's trajectory as another seed does.  The quickstart and the
recipes train every system once per ``--seeds`` value on the same data and test sets, and report
per score ``mean ± sd`` (``sd``: the sample standard deviation, n - 1 in the denominator).
"""

import math
import statistics
from typing import Dict, Mapping, Optional, Sequence, Tuple

#: the scores that are combined over seeds
KEYS = ("bleu", "ratio", "nll")


def mean_sd(values: Sequence[float]) -> Tuple[float, Optional[float]]:
    """The mean and the sample standard deviation (None for a single value; NaN stays NaN)."""
    values = [float(v) for v in values]
    if any(math.isnan(v) for v in values):
        return math.nan, math.nan
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else None


def combine_entries(entries: Sequence[dict]) -> dict:
    """One bucket's entries of every seed -> one entry: ``KEY`` (mean), ``KEY_sd``, ``KEY_seeds``
    for each score present in every seed, ``n`` as the seeds'.  An entry that could not be computed in
    some seed (``"na"``: its reason) is unavailable in the combination too, never a mean of the rest."""
    if len(entries) == 1:
        return dict(entries[0])
    out = {"n": entries[0].get("n"), "seeds": len(entries)}
    unavailable = [e["na"] for e in entries if e.get("na")]
    if unavailable:
        out.update({key: None for key in KEYS if key in entries[0]}, na=unavailable[0])
        return out
    for key in KEYS:
        values = [e.get(key) for e in entries]
        if all(v is not None for v in values):
            out[key], out[key + "_sd"] = mean_sd(values)
            out[key + "_seeds"] = values
    return out


def combine(per_seed: Mapping[int, Mapping[str, Mapping[str, dict]]]) -> Dict[str, Dict[str, dict]]:
    """``{seed: {system: {label: entry}}}`` -> ``{system: {label: combined entry}}`` (labels that are
    no score, such as ``"signature"``, are taken from the first seed).  Every seed must have the
    same systems and labels."""
    seeds = list(per_seed)
    first = per_seed[seeds[0]]
    out: Dict[str, Dict[str, dict]] = {}
    for system, labels in first.items():
        out[system] = {}
        for label, value in labels.items():
            if not isinstance(value, dict):
                out[system][label] = value
                continue
            out[system][label] = combine_entries([per_seed[s][system][label] for s in seeds])
    return out


def describe(seeds: Sequence[int], n_bootstrap: int) -> str:
    """The line that says what the ± of a table is."""
    if len(seeds) > 1:
        return (f"mean ± standard deviation over {len(seeds)} training seeds ({', '.join(map(str, seeds))}); "
                "per-seed values in the JSON")
    if n_bootstrap < 2:
        return (f"ONE training seed ({seeds[0]}), no interval: a rerun with another seed can move these scores; "
                "--seeds 1 2 3 measures by how much")
    return (f"ONE training seed ({seeds[0]}): ±x is the half-width of the 95% confidence interval of sacreBLEU's "
            f"bootstrap resampling of the test sentences ({n_bootstrap} resamples); it leaves out the variation "
            "between training runs, which only more seeds (--seeds 1 2 3) measure")
