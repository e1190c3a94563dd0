"""Fix 13: options with which fairseq's ``main`` cannot run are one line before it starts, not a traceback.

* ``--ddp-backend fully_sharded`` shards the model with fairscale's ``FullyShardedDataParallel``, which runs on
  CUDA GPUs only: on the CPU fairseq stopped with an ``ImportError`` (no fairscale) or "Torch not compiled with CUDA
  enabled" (with it).
* ``fairseq-train`` and ``fairseq-validate`` without ``--max-tokens`` or ``--batch-size``: fairseq's ``main``
  asserts "Must specify batch size either with --max-tokens or --batch-size" (``fairseq-generate`` and
  ``fairseq-eval-lm`` have their own defaults).

Each is checked where fairseq's command-line tools hand their configuration to ``main``
(``distributed_utils.call_main``), before any process is spawned or anything written.

Extension point: none; ``call_main`` is a plain function of fairseq 0.12 (a wrapper, once).
"""

import functools
import importlib.util

from fairseq_pe.compat.patching import fairseq_matches, patch

#: the fairseq releases this fix is written for
FIXES_FAIRSEQ = ("0.12.",)
#: it changes stock fairseq's behaviour for every task of the process (docs/install.md lists it)
CHANGES_STOCK = True
SUMMARY = "--ddp-backend fully_sharded without CUDA or fairscale, and a run without a batch size, are one line"

#: the mains of fairseq's tools that need --max-tokens or --batch-size
_NEED_A_BATCH_SIZE = ("fairseq_cli.train", "fairseq_cli.validate")


def check_run(cfg, main):
    """The :class:`~fairseq_pe.errors.UserError` of options with which ``main`` cannot run (module docstring)."""
    import torch

    from fairseq_pe.errors import UserError

    training = getattr(cfg, "distributed_training", None)
    if getattr(training, "ddp_backend", None) == "fully_sharded":
        cpu = getattr(getattr(cfg, "common", None), "cpu", False)
        if cpu or not torch.cuda.is_available():
            raise UserError("--ddp-backend fully_sharded shards the model with fairscale's FullyShardedDataParallel, "
                            "which runs on CUDA GPUs only" + (" (--cpu is given)" if cpu else " (this torch sees none)")
                            + "; on the CPU use --ddp-backend pytorch_ddp (the default) or legacy_ddp")
        if importlib.util.find_spec("fairscale") is None:
            raise UserError("--ddp-backend fully_sharded needs fairscale (pip install fairscale), which is not "
                            "installed")
    dataset = getattr(cfg, "dataset", None)
    if getattr(main, "__module__", None) in _NEED_A_BATCH_SIZE and dataset is not None \
            and getattr(dataset, "max_tokens", None) is None and getattr(dataset, "batch_size", None) is None:
        raise UserError("give --max-tokens (tokens per batch, e.g. 4096) or --batch-size (sentences per batch): "
                        "fairseq needs one of them to batch the data")


def _checked_before_main(call_main):
    @functools.wraps(call_main)
    def wrapper(cfg, main, *args, **kwargs):
        check_run(cfg, main)
        return call_main(cfg, main, *args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "run_checks",
                           "--ddp-backend fully_sharded on the CPU, or no batch size, stop with a traceback"):
        return False
    from fairseq.distributed import utils as distributed_utils

    patch(distributed_utils, "call_main", _checked_before_main)
    return True
