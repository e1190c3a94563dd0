"""Resuming a KERPLE training with one pair r₁, r₂ per layer in two processes (issue 39, 4c).

fairseq's Trainer wraps the model in DDP (its first use of ``trainer.model``, in ``load_checkpoint``) before it
loads the checkpoint into it.  Loading used to replace the r₁, r₂ Parameter objects of a model built with one pair
for all layers by a pair per layer: DDP then reduced the old objects, which no longer trained, and every rank went
on with its own gradients.  Loading now copies into the model's own parameters, and a checkpoint whose layout the
model does not have is refused by name (``--pe-relative-untie-layers``).

``torchrun --nproc_per_node 2 fairseq-train ... --cpu --distributed-backend gloo --ddp-backend c10d`` through
tests/train_recording_ranks.py, which records on each rank, before every update, r₁, r₂ and whether they are the
objects DDP reduces and the optimizer updates."""

import os
import re
import shutil

import pytest
import torch
from fairseq import checkpoint_utils

from helpers import PLUGIN, cli, synthetic_data_bin, torchrun

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_recording_ranks.py")
KERPLE = ["--pe-absolute", "none", "--pe-relative", "kerple-log"]
PER_LAYER = ["--pe-relative-untie-layers"]
NAMES = ("r1", "r2")


def train(data, save, *flags, updates, check=True, two_processes_recording=None):
    """``fairseq-train`` to ``updates`` updates in ``save`` (resuming from its checkpoint_last.pt); with
    ``two_processes_recording`` (an output prefix) in two processes through tests/train_recording_ranks.py."""
    command = ["fairseq-train"]
    if two_processes_recording is not None:
        command = [*torchrun(WORKER), two_processes_recording, ",".join(NAMES)]
    run = cli(*command, data, "--user-dir", PLUGIN, "--arch", "transformer_pe_tiny", "--share-all-embeddings",
              "--optimizer", "adam", "--lr", "0.01", "--max-tokens", "300", "--max-update", str(updates), "--cpu",
              "--distributed-backend", "gloo", "--ddp-backend", "c10d", "--num-workers", "0", "--seed", "1",
              "--dropout", "0", "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "1",
              "--disable-validation", "--save-dir", str(save), *KERPLE, *flags, check=check)
    return run, run.stdout + run.stderr


def kerple_parameters(path):
    state = checkpoint_utils.load_checkpoint_to_cpu(path)["model"]
    return {name: value for name, value in state.items() if name.endswith(tuple(f"relative.{n}" for n in NAMES))}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """3 updates of a model with a pair per layer (one process): its save directory."""
    root = tmp_path_factory.mktemp("kerple-resume")
    data = synthetic_data_bin(root, train_size=240, valid_size=10, test_buckets=[(1, 8)], test_per_bucket=2, seed=3)
    _, log = train(data, root / "save", *PER_LAYER, updates=3)
    assert "num_updates=3" in log, log[-3000:]
    return data, root / "save"


def test_a_resumed_run_trains_the_loaded_parameters_on_both_ranks(trained, tmp_path):
    """Resumed from update 3 to 6: before every update r₁, r₂ are the objects DDP reduces and the optimizer
    updates; the first update starts from the checkpoint's values; they change; both ranks hold the same values at
    every update, and the checkpoint of update 6 has them."""
    data, first = trained
    save = tmp_path / "save"
    shutil.copytree(first, save)
    loaded = kerple_parameters(str(save / "checkpoint_last.pt"))
    assert {tuple(v.shape) for v in loaded.values()} == {(2, 4)}  # a pair per layer and head
    _, log = train(data, save, *PER_LAYER, updates=6, two_processes_recording=str(tmp_path / "records"))
    assert "distributed init (rank 1)" in log and log.count("done training in") == 1, log[-3000:]
    assert "num_updates=6" in log, log[-3000:]
    ranks = [torch.load(tmp_path / f"records.rank{rank}.pt") for rank in (0, 1)]
    for records in ranks:
        assert len(records) == 3 and all(r["ddp"] and r["optimizer"] for r in records)
        assert records[0]["values"].keys() == {k for k in loaded}
        for name, value in loaded.items():
            assert torch.equal(records[0]["values"][name], value), name  # what was loaded is what trains
    for earlier, later in zip(ranks[0], ranks[1]):
        for name in loaded:
            assert torch.equal(earlier["values"][name], later["values"][name]), name  # the ranks agree
    final = kerple_parameters(str(save / "checkpoint_last.pt"))
    for name, value in loaded.items():
        assert not torch.equal(final[name], value), name  # they trained
        assert not torch.equal(ranks[0][-1]["values"][name], value), name


def test_a_run_resumed_with_one_pair_for_all_layers_is_refused_by_name(trained, tmp_path):
    """The command line of a run from before the sharing (no flag: then one pair per layer) builds one pair for all
    layers: the checkpoint is refused naming the flag that builds its layout, instead of a run in which DDP reduces
    parameters the model no longer uses (two processes before the fix: "Expected to have finished reduction in the
    prior iteration ... Parameter indices which did not receive grad for rank 1: 1 2 35 36", the old r₁, r₂).  The
    refusal is the load's, the same in one process."""
    data, first = trained
    save = tmp_path / "save"
    shutil.copytree(first, save)
    run, log = train(data, save, updates=6, check=False)
    # one line (fairseq's Trainer re-raises it as "Cannot load model parameters from checkpoint ..."), status 2
    assert run.returncode == 2 and "Traceback" not in run.stderr, log[-3000:]
    assert re.search(r"fairseq-train: error: .*one pair per layer.*--pe-relative-untie-layers", run.stderr), log[-3000:]
    assert "num_updates=4" not in log
