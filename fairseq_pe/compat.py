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


def apply():
    from fairseq import checkpoint_utils
    from fairseq.data import data_utils

    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "_fairseq_pe_patched", False):
        checkpoint_utils.load_checkpoint_to_cpu = _load_checkpoint_trusted(checkpoint_utils.load_checkpoint_to_cpu)
    if not getattr(data_utils.batch_by_size, "_fairseq_pe_patched", False):
        data_utils.batch_by_size = _batch_by_size_keeping_every_sentence(data_utils.batch_by_size)
