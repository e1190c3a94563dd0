"""The fairseq traps fixed by fairseq_pe.compat."""

import argparse

import numpy as np
import pytest
import torch

import fairseq_pe  # noqa: F401  (applies the fixes)
from fairseq import checkpoint_utils
from fairseq.data import data_utils


@pytest.mark.parametrize("multiple", [1, 8])
@pytest.mark.parametrize("n", [1, 13, 64, 101])
def test_batch_by_size_never_drops_a_sentence(n, multiple):
    rng = np.random.RandomState(n)
    sizes = rng.randint(1, 40, size=n)
    indices = np.argsort(sizes, kind="mergesort")
    batches = data_utils.batch_by_size(indices, lambda i: int(sizes[i]), max_tokens=120,
                                       required_batch_size_multiple=multiple)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(n))  # every sentence exactly once
    for b in batches:
        assert sizes[b].max() * len(b) <= 120 or len(b) <= multiple


def test_stock_batch_by_size_drops_the_last_batch():
    """The trap itself, on the unwrapped fairseq function (documents why the fix exists)."""
    stock = data_utils.batch_by_size.__wrapped__
    sizes = np.full(13, 5)
    batches = stock(np.arange(13), lambda i: 5, max_tokens=40, required_batch_size_multiple=8)
    assert sum(len(b) for b in batches) < 13


def test_fairseq_checkpoint_loader_accepts_argparse_namespace(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"args": argparse.Namespace(arch="transformer_pe_tiny"), "model": {"w": torch.ones(2)},
                "cfg": None, "extra_state": {},
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                       "lr_scheduler_state": {"best": None}, "num_updates": 0}]}, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert torch.equal(state["model"]["w"], torch.ones(2))
    # only fairseq's loader is relaxed: torch's own default is untouched
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 6):
        with pytest.raises(Exception, match="weights_only|Unsupported global"):
            torch.load(path)
