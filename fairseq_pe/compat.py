"""Fixes for fairseq traps on current torch, applied when the plugin is imported.

Importing ``fairseq_pe`` (``--user-dir fairseq_pe`` or ``import fairseq_pe``) applies them,
so ``fairseq-train`` / ``fairseq-generate`` users never see them:

1. torch >= 2.6 loads with ``weights_only=True`` by default; fairseq checkpoints hold an
   ``argparse.Namespace``, omegaconf configs and meters, so ``fairseq-generate`` and
   ``--restore-file`` fail with ``Unsupported global: argparse.Namespace``.  fairseq's
   checkpoint loader is wrapped so that *it* loads with ``weights_only=False`` (checkpoints
   are trusted files you trained or downloaded yourself); every other ``torch.load`` keeps
   torch's default.
2. ``fairseq.data.data_utils.batch_by_size`` drops the whole last batch when its size is
   not a multiple of ``--required-batch-size-multiple`` (default 8): test sentences vanish
   from ``fairseq-generate`` and validation.  It is wrapped to append the dropped sentences
   as a final batch, so every sentence is seen exactly once.
3. fairseq's fused attention fast path skips attention subclass hooks: handled where the
   attention modules are built (:func:`fairseq_pe.models.layers.python_attention_path`).
4. ``torchrun --nproc_per_node N fairseq-train ... --cpu --distributed-backend gloo``: on a
   machine without GPUs fairseq keeps ``--distributed-world-size`` at its default (the GPU
   count, 1), so every process trains its own model alone and they overwrite each other's
   checkpoints; given the world size it divides by ``torch.cuda.device_count()`` (0).  The
   launch-environment setup is wrapped: without GPUs, torchrun's ``WORLD_SIZE``/``RANK``
   are used as they are with GPUs, with device 0 (the CPU); and fairseq's DDP wrapper, which
   passes ``device_ids=[0]`` (refused by torch for a CPU module), passes none on the CPU.
"""

import contextlib
import functools
import os
import warnings

import numpy as np

_FORCE_NO_WEIGHTS_ONLY = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


@contextlib.contextmanager
def trusted_torch_load():
    """Within the block, ``torch.load`` calls that do not pass ``weights_only`` use ``False``."""
    previous = os.environ.get(_FORCE_NO_WEIGHTS_ONLY)
    os.environ[_FORCE_NO_WEIGHTS_ONLY] = "1"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=f".*{_FORCE_NO_WEIGHTS_ONLY}.*")
            yield
    finally:
        if previous is None:
            os.environ.pop(_FORCE_NO_WEIGHTS_ONLY, None)
        else:
            os.environ[_FORCE_NO_WEIGHTS_ONLY] = previous


def _load_checkpoint_trusted(load_checkpoint_to_cpu):
    @functools.wraps(load_checkpoint_to_cpu)
    def wrapper(*args, **kwargs):
        with trusted_torch_load():
            return load_checkpoint_to_cpu(*args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _batch_by_size_keeping_every_sentence(batch_by_size):
    @functools.wraps(batch_by_size)
    def wrapper(indices, num_tokens_fn, *args, **kwargs):
        batches = batch_by_size(indices, num_tokens_fn, *args, **kwargs)
        indices = np.asarray(indices, dtype=np.int64)
        covered = sum(len(b) for b in batches)
        if covered < len(indices):
            seen = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if batches else np.zeros(0, np.int64)
            missing = indices[~np.isin(indices, seen)]
            batches = list(batches) + [missing]
        return batches

    wrapper._fairseq_pe_patched = True
    return wrapper


def _torchrun_on_cpu(infer_init_method):
    @functools.wraps(infer_init_method)
    def wrapper(cfg, *args, **kwargs):
        import torch

        launched = all(k in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"))
        if launched and torch.cuda.device_count() == 0 and cfg.distributed_init_method is None \
                and not getattr(cfg, "tpu", False):
            world = int(os.environ["WORLD_SIZE"])
            if cfg.distributed_world_size not in (1, world):
                raise ValueError(f"--distributed-world-size {cfg.distributed_world_size} contradicts torchrun's "
                                 f"WORLD_SIZE={world}; drop the flag")
            if world > 1:
                cfg.distributed_init_method = "env://"
                cfg.distributed_world_size = world
                cfg.distributed_rank = int(os.environ["RANK"])
                cfg.device_id = 0
                cfg.distributed_no_spawn = True  # torchrun created the processes
                return
        return infer_init_method(cfg, *args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _ddp_on_cpu(factory):
    import sys

    @functools.wraps(factory)
    def wrapper(args, model, process_group, device, *rest, **kwargs):
        on_cpu = getattr(device, "type", str(device)) == "cpu"
        if not (on_cpu and getattr(args, "ddp_backend", None) in {"c10d", "pytorch_ddp"}):
            return factory(args, model, process_group, device, *rest, **kwargs)
        module = sys.modules[factory.__module__]
        ddp = module.DistributedDataParallel

        def cpu_ddp(*a, device_ids=None, output_device=None, **kw):
            return ddp(*a, **kw)

        module.DistributedDataParallel = cpu_ddp
        try:
            return factory(args, model, process_group, device, *rest, **kwargs)
        finally:
            module.DistributedDataParallel = ddp

    wrapper._fairseq_pe_patched = True
    return wrapper


def apply():
    from fairseq import checkpoint_utils
    from fairseq.data import data_utils
    from fairseq.distributed import utils as distributed_utils

    from fairseq import models

    if not getattr(models.DistributedFairseqModel, "_fairseq_pe_patched", False):
        models.DistributedFairseqModel = _ddp_on_cpu(models.DistributedFairseqModel)
    if not getattr(distributed_utils.infer_init_method, "_fairseq_pe_patched", False):
        distributed_utils.infer_init_method = _torchrun_on_cpu(distributed_utils.infer_init_method)

    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "_fairseq_pe_patched", False):
        checkpoint_utils.load_checkpoint_to_cpu = _load_checkpoint_trusted(checkpoint_utils.load_checkpoint_to_cpu)
    if not getattr(data_utils.batch_by_size, "_fairseq_pe_patched", False):
        data_utils.batch_by_size = _batch_by_size_keeping_every_sentence(data_utils.batch_by_size)
