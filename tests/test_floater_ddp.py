"""FLOATER under fairseq's distributed training on CPU: the command of docs/floater.md,
``torchrun --nproc_per_node 2 fairseq-train ... --cpu --distributed-backend gloo``, trains one
model in two processes (DDP, without --find-unused-parameters)."""

import os

import torch

from fairseq import checkpoint_utils

from fairseq_pe.translation.synthetic import write_corpus

from helpers import PLUGIN, cli, torchrun


def test_torchrun_two_processes_gloo(tmp_path):
    raw = write_corpus(str(tmp_path / "raw"), train_size=400, valid_size=20, test_buckets=[(1, 8)],
                       test_per_bucket=5, seed=7)
    data = str(tmp_path / "bin")
    cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train",
        "--validpref", f"{raw}/valid", "--destdir", data, "--joined-dictionary", "--workers", "1")
    save = str(tmp_path / "ckpt")
    run = cli(*torchrun("fairseq-train"), data,
              "--user-dir", PLUGIN, "--arch", "transformer_pe_tiny", "--pe-absolute", "floater", "--pe-all-blocks",
              "--pe-floater-bias", "--share-all-embeddings", "--optimizer", "adam", "--lr", "0.003",
              "--max-tokens", "600", "--max-update", "6", "--cpu", "--distributed-backend", "gloo",
              "--num-workers", "0", "--seed", "1", "--no-epoch-checkpoints", "--log-format", "simple",
              "--log-interval", "1", "--save-dir", save)
    log = run.stdout + run.stderr
    assert "distributed init (rank 1)" in log, log[-3000:]
    assert "num_updates=6" in log, log[-3000:]
    assert log.count("done training in") == 1, "two independent trainings instead of one distributed one"
    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(save, "checkpoint_last.pt"))
    assert state["cfg"]["distributed_training"]["distributed_world_size"] == 2
    assert not state["cfg"]["distributed_training"]["find_unused_parameters"]
    assert torch.isfinite(state["model"]["floater.dynamics.w1"]).all()

