"""Fix 2: ``data_utils.batch_by_size`` keeps every sentence.

fairseq 0.12 drops the whole last batch when its size is not a multiple of ``--required-batch-size-multiple``
(default 8): 21 sentences with a multiple of 8 give batches of 8 and 8, and the last 5 vanish from
``fairseq-generate``, validation and training.  The dropped sentences are appended as one final batch, so every
sentence is seen exactly once.

Extension point: none; every task's ``get_batch_iterator`` calls ``data_utils.batch_by_size`` (a wrapper, once).
"""

import functools

import numpy as np

from fairseq_pe.compat.patching import fairseq_matches, patch

#: the fairseq releases this fix is written for
FIXES_FAIRSEQ = ("0.12.",)
#: it changes stock fairseq's behaviour for every task of the process (docs/install.md lists it)
CHANGES_STOCK = True
SUMMARY = "batch_by_size keeps the last sentences that --required-batch-size-multiple dropped"


def _batch_by_size_keeping_every_sentence(batch_by_size):
    @functools.wraps(batch_by_size)
    def wrapper(indices, num_tokens_fn, *args, **kwargs):
        batches = batch_by_size(indices, num_tokens_fn, *args, **kwargs)
        indices = np.asarray(indices, dtype=np.int64)
        covered = sum(len(b) for b in batches)
        if covered < len(indices):
            seen = (np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if batches
                    else np.zeros(0, np.int64))
            missing = indices[~np.isin(indices, seen)]
            batches = list(batches) + [missing]
        return batches

    wrapper._fairseq_pe_patched = True
    return wrapper


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "batch_by_size",
                           "the last batch of a split may be dropped (--required-batch-size-multiple)"):
        return False
    from fairseq.data import data_utils

    patch(data_utils, "batch_by_size", _batch_by_size_keeping_every_sentence)
    return True
