"""Fix 5: ``torchrun --nproc_per_node N fairseq-train ... --cpu --distributed-backend gloo`` trains one model.

Without GPUs fairseq 0.12 keeps ``--distributed-world-size`` at the GPU count (1), so every process trains its own
model and they overwrite each other's checkpoints; given the world size it divides by ``torch.cuda.device_count()``
(0).  Without GPUs, torchrun's ``WORLD_SIZE``/``RANK`` are used as they are with GPUs, with device 0 (the CPU); and
fairseq's DDP wrapper, which passes ``device_ids=[0]`` (refused by torch for a CPU module), passes none on the CPU.

Extension point: none; ``infer_init_method`` and ``DistributedFairseqModel`` are plain functions of fairseq 0.12
(``--ddp-backend`` is a fixed choice, not a registry) (wrappers, once).
"""

import functools
import os

from fairseq_pe.compat.patching import fairseq_matches, patch

#: the fairseq releases this fix is written for
FIXES_FAIRSEQ = ("0.12.",)
#: it changes stock fairseq's behaviour for every task of the process (docs/install.md lists it)
CHANGES_STOCK = True
SUMMARY = "torchrun on the CPU: one distributed training (WORLD_SIZE/RANK), DDP without device_ids"


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


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "distributed_cpu",
                           "torchrun on the CPU trains one model per process"):
        return False
    from fairseq import models
    from fairseq.distributed import utils as distributed_utils

    patch(models, "DistributedFairseqModel", _ddp_on_cpu)
    patch(distributed_utils, "infer_init_method", _torchrun_on_cpu)
    return True
