"""Host syncs and operators per step, for every encoding (``scripts/count_ops.py``, counted on the CPU).

On a GPU a training step waits for the device at each host sync (``.item()``, ``bool()`` of a tensor, a size that
depends on the data), and step-by-step decoding is bound by the number of operators it launches.  Targets: no
encoding syncs more than stock fairseq's own code in a training step (forward, backward, gradient norm, optimizer
step through fairseq's Trainer) or in a decoding step; a decoding step runs at most 1.15× the operators of the
sinusoidal APE's.
"""

from helpers import load_script


def test_no_encoding_syncs_more_than_stock_or_decodes_with_more_than_115_percent_of_the_apes_operators():
    script = load_script("count_ops")
    counts = script.count(list(script.SYSTEMS))
    stock, reference = counts[script.STOCK], counts[script.REFERENCE]
    # the counts are real: stock fairseq's own syncs are there to be matched (its padding checks, the gradient norm)
    assert stock["train"].syncs > 0 and stock["decode"].syncs > 0 and reference["decode"].total > 100
    failures = []
    for name, c in counts.items():
        if name == script.STOCK:
            continue
        for kind in ("train", "decode"):
            if c[kind].syncs > stock[kind].syncs:
                failures.append(f"{name}: {c[kind].syncs} syncs per {kind} step, stock {stock[kind].syncs}: "
                                f"{c[kind].sync_ops()} against {stock[kind].sync_ops()}")
        ratio = c["decode"].total / reference["decode"].total
        if ratio > script.OPS_RATIO:
            failures.append(f"{name}: {c['decode'].total} operators per decoding step, {ratio:.2f}× "
                            f"{script.REFERENCE}'s {reference['decode'].total}")
    assert not failures, "\n".join(failures) + "\n" + script.table(counts)


def test_the_counter_sees_a_sync():
    """The counter itself: ``.item()`` and ``bool()`` of a tensor are syncs, views are no kernels."""
    import torch

    from fairseq_pe.models.op_count import counting

    x = torch.arange(6.0)
    with counting() as c:
        y = x.view(2, 3).t()
        bool(y.sum() > 0)
        x.max().item()
    assert c.syncs == 2 and c.views["view"] == 1 and c.views["t"] == 1 and c.kernels == c.total - 2
