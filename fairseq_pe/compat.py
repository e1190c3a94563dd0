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
3. User errors (a bad ``--pe-*`` value, a missing or unreadable checkpoint, a sequence longer
   than a learned table) end the process with one line ``PROG: error: ...`` and exit status 2
   instead of a traceback (:mod:`fairseq_pe.errors`); checkpoint loading reports a missing or
   corrupt file that way.
4. fairseq's fused attention fast path skips attention subclass hooks: every attention of the
   plugin's models is a :class:`fairseq_pe.models.attention.PositionAttention`, which calls torch's
   fused kernel itself after the hooks.
5. ``torchrun --nproc_per_node N fairseq-train ... --cpu --distributed-backend gloo``: on a
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
import pickle
import warnings
import zipfile

import numpy as np

from fairseq_pe.errors import UserError, install_excepthook

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


#: what torch.load raises for a file that is not a (complete) torch checkpoint (OSError: a truncated zip)
_UNREADABLE = (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, UnicodeDecodeError, OSError)
_UNREADABLE_RUNTIME = ("PytorchStreamReader", "zip archive", "Invalid magic number", "invalid load key")


def _is_local(path) -> bool:
    return isinstance(path, (str, os.PathLike)) and "://" not in str(path)


def _load_checkpoint_trusted(load_checkpoint_to_cpu):
    @functools.wraps(load_checkpoint_to_cpu)
    def wrapper(path, *args, **kwargs):
        if _is_local(path) and not os.path.exists(path):
            raise UserError(f"checkpoint {path}: no such file (check --path / --restore-file)")
        try:
            with trusted_torch_load():
                return load_checkpoint_to_cpu(path, *args, **kwargs)
        except _UNREADABLE as e:
            raise UserError(f"checkpoint {path} cannot be read ({type(e).__name__}: {e}): it is not a complete "
                            "fairseq checkpoint (truncated or another kind of file?)") from e
        except RuntimeError as e:
            if not any(marker in str(e) for marker in _UNREADABLE_RUNTIME):
                raise
            raise UserError(f"checkpoint {path} cannot be read ({e}): it is not a complete fairseq checkpoint "
                            "(truncated or another kind of file?)") from e

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


def _model_files_checked(load_model_ensemble_and_task):
    @functools.wraps(load_model_ensemble_and_task)
    def wrapper(filenames, *args, **kwargs):
        if kwargs.get("num_shards", 1) == 1 and not kwargs.get("suffix"):
            for name in filenames:
                if _is_local(name) and not os.path.exists(name):
                    raise UserError(f"--path {name}: no such checkpoint file")
        return load_model_ensemble_and_task(filenames, *args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _size_errors_named(filter_indices_by_size):
    @functools.wraps(filter_indices_by_size)
    def wrapper(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        try:
            return filter_indices_by_size(self, indices, dataset, max_positions, ignore_invalid_inputs)
        except Exception as e:  # fairseq raises a bare Exception here
            if type(e) is not Exception or not str(e).startswith("Size of sample"):
                raise
            raise UserError(f"{e}. The limit is the smaller of the task's --max-source-positions/"
                            "--max-target-positions and the model's (a learned position table's length, fixed at "
                            "training time); raise the task's limits, or use an encoding without a length limit") from e

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

    install_excepthook()
    from fairseq.tasks import FairseqTask

    if not getattr(FairseqTask.filter_indices_by_size, "_fairseq_pe_patched", False):
        FairseqTask.filter_indices_by_size = _size_errors_named(FairseqTask.filter_indices_by_size)
    if not getattr(checkpoint_utils.load_model_ensemble_and_task, "_fairseq_pe_patched", False):
        checkpoint_utils.load_model_ensemble_and_task = _model_files_checked(
            checkpoint_utils.load_model_ensemble_and_task)
    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "_fairseq_pe_patched", False):
        checkpoint_utils.load_checkpoint_to_cpu = _load_checkpoint_trusted(checkpoint_utils.load_checkpoint_to_cpu)
    if not getattr(data_utils.batch_by_size, "_fairseq_pe_patched", False):
        data_utils.batch_by_size = _batch_by_size_keeping_every_sentence(data_utils.batch_by_size)
