"""Two processes (``torchrun --nproc_per_node 2 fairseq-train ... --cpu --distributed-backend gloo``) train what one
would, whatever fairseq's DDP options (issue 30, 5 and 6).

* ``--broadcast-buffers`` copies rank 0's buffers to every rank at each forward pass.  rotary-embedding-torch kept
  its angle cache in a buffer and the cached length in a plain attribute: rank 1 then rotated with rank 0's rows
  (26 of 36 wrong at step 1 in the issue's run).  The plugin keeps no per-process state in a buffer: the losses of a
  RoPE training are the same with and without the flag.
* ``--ddp-backend legacy_ddp`` all-reduces the gradients through one flat buffer of the first parameter's dtype:
  under ``--bf16`` (or ``--fp16``) the float32 position parameters' gradients were rounded to half precision.  They
  are reduced in their own dtype now: the trained KERPLE parameters equal those of ``--ddp-backend c10d`` (which
  buckets each dtype apart), exactly; so do FoX's gates, CoPE's tables and DAPE's networks (with KERPLE's).
* ``--ddp-backend fully_sharded`` with half precision is refused by name (FSDP flattens parameters of one dtype).
"""

import os
import re

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_pe.errors import UserError

from helpers import PLUGIN, cli, synthetic_data_bin, torchrun, training_config


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic_data_bin(tmp_path_factory.mktemp("ddp"), train_size=240, valid_size=10, test_buckets=[(1, 8)],
                              test_per_bucket=2, seed=3)


def train_two_processes(data, save, *flags, updates=5):
    """Losses of every update (rank 0's log) of a 2-process gloo training, and its last checkpoint."""
    run = cli(*torchrun("fairseq-train"), data, "--user-dir", PLUGIN, "--arch", "transformer_pe_tiny",
              "--share-all-embeddings", "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "300",
              "--max-update", str(updates), "--cpu", "--distributed-backend", "gloo", "--num-workers", "0", "--seed", "1",
              "--dropout", "0", "--no-epoch-checkpoints", "--no-save-optimizer-state", "--log-format", "simple",
              "--log-interval", "1", "--disable-validation", "--save-dir", str(save), *flags)
    log = run.stdout + run.stderr
    assert "distributed init (rank 1)" in log and log.count("done training in") == 1, log[-3000:]
    losses = [float(x) for x in re.findall(r"train_inner \| epoch \d+:\s+\d+ / \d+ loss=([0-9.]+),", log)]
    assert len(losses) == updates, log[-3000:]
    return losses, checkpoint_utils.load_checkpoint_to_cpu(os.path.join(save, "checkpoint_last.pt"))["model"]


@pytest.fixture(scope="module")
def growing(tmp_path_factory):
    """8 pairs of lengths 4, 8, ..., 32, trained one pair per batch, unshuffled (``--curriculum``): rank 1 gets the
    longer pair of every update, so in the second epoch it reads rows of an angle cache that rank 0 never filled."""
    import random

    root = tmp_path_factory.mktemp("growing")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    for split in ("train", "valid"):
        for lang, extra in (("src", 0), ("tgt", 1)):
            with open(root / f"{split}.{lang}", "w") as f:
                f.writelines(" ".join(rng.choice(words) for _ in range(n + extra)) + "\n" for n in range(4, 36, 4))
    dest = str(root / "bin")
    cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{root}/train",
        "--validpref", f"{root}/valid", "--destdir", dest, "--joined-dictionary", "--workers", "1")
    return dest


def test_broadcast_buffers_do_not_change_a_rope_training(growing, tmp_path):
    flags = ["--pe-absolute", "none", "--pe-relative", "rope", "--batch-size", "1", "--curriculum", "100"]
    plain, plain_model = train_two_processes(growing, tmp_path / "plain", *flags, updates=8)
    broadcast, broadcast_model = train_two_processes(growing, tmp_path / "broadcast", *flags, "--broadcast-buffers",
                                                     updates=8)
    assert broadcast == plain
    for key in plain_model:
        assert torch.equal(broadcast_model[key], plain_model[key]), key


@pytest.mark.parametrize("relative", [["kerple-power"],
                                      # the encodings of the logits hook (issue 43): their gates, tables and networks
                                      # are float32 parameters of every layer, all of which get a gradient (c10d
                                      # fails on a parameter without one)
                                      ["fox"], ["cope"], ["kerple-log", "--pe-dape", "v2"]],
                         ids=["kerple-power", "fox", "cope", "kerple-log-dape2"])
def test_legacy_ddp_reduces_float32_position_gradients_in_float32(data, tmp_path, relative):
    flags = ["--pe-absolute", "none", "--pe-relative", *relative, "--bf16"]
    _, c10d = train_two_processes(data, tmp_path / "c10d", *flags, "--ddp-backend", "c10d")
    _, legacy = train_two_processes(data, tmp_path / "legacy", *flags, "--ddp-backend", "legacy_ddp")
    positions = [k for k in c10d if ".relative." in k]
    assert positions and all(c10d[k].dtype == torch.float32 for k in positions)
    for key in positions:
        torch.testing.assert_close(legacy[key], c10d[key], rtol=1e-6, atol=1e-7,
                                   msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.parametrize("precision", [["--fp16"], ["--bf16"], ["--fp16", "--memory-efficient-fp16"]])
def test_fully_sharded_with_half_precision_is_refused_by_name(precision):
    from types import SimpleNamespace

    from fairseq.data import Dictionary

    from fairseq_pe.models.transformer_pe import TransformerPEModel

    cfg = training_config("--ddp-backend", "fully_sharded", *precision)
    d = Dictionary()
    with pytest.raises(UserError, match=f"--ddp-backend fully_sharded is not supported with {precision[0]}"):
        TransformerPEModel.build_model(cfg.model, SimpleNamespace(source_dictionary=d, target_dictionary=d))
