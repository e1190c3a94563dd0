"""Fix 2: ``data_utils.batch_by_size`` keeps every sentence, and one longer than a batch is a one-line user error.

fairseq 0.12 drops the whole last batch when its size is not a multiple of ``--required-batch-size-multiple``
(default 8): 21 sentences with a multiple of 8 give batches of 8 and 8, and the last 5 vanish from
``fairseq-generate``, validation and training.  The dropped sentences are appended as one final batch, so every
sentence is seen exactly once.  A sample longer than ``--max-tokens`` (``fairseq-eval-lm --sample-break-mode
eos|complete`` keeps each sentence whole, and its default ``--max-tokens`` is 36000) stopped with the assertion
"Sentences lengths should not exceed max_tokens" of fairseq's Cython batcher: it is a
:class:`~fairseq_pe.errors.UserError` naming ``--max-tokens``, the longest sample and the value that holds it.

Extension point: none; every task's ``get_batch_iterator`` calls ``data_utils.batch_by_size`` (a wrapper, once).
"""

import functools

import numpy as np

from fairseq_pe.compat.patching import fairseq_matches, patch

#: the fairseq releases this fix is written for
FIXES_FAIRSEQ = ("0.12.",)
#: it changes stock fairseq's behaviour for every task of the process (docs/install.md lists it)
CHANGES_STOCK = True
SUMMARY = ("batch_by_size keeps the last sentences that --required-batch-size-multiple dropped; a sample longer "
           "than --max-tokens is one line")


def _too_long_for_a_batch(error, indices, num_tokens_fn, num_tokens_vec, max_tokens):
    """The :class:`UserError` for fairseq's assertion that a sample is longer than ``--max-tokens``."""
    from fairseq_pe.errors import UserError

    sizes = (np.asarray(num_tokens_vec, dtype=np.int64) if num_tokens_vec is not None
             else np.asarray([num_tokens_fn(i) for i in indices], dtype=np.int64))
    longest = int(sizes.max()) if len(sizes) else 0
    over = int((sizes > max_tokens).sum()) if max_tokens else 0
    return UserError(
        f"--max-tokens {max_tokens}: {over:,} of {len(sizes):,} samples are longer than a batch may hold (the longest "
        f"has {longest:,} tokens), and fairseq batches every sample whole; give --max-tokens {longest} or more "
        "(fairseq-eval-lm's default is 36000; its --sample-break-mode eos and complete keep each sentence whole, "
        "none cuts blocks of --tokens-per-sample)")


def _batch_by_size_keeping_every_sentence(batch_by_size):
    @functools.wraps(batch_by_size)
    def wrapper(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, *args, **kwargs):
        try:
            batches = batch_by_size(indices, num_tokens_fn, num_tokens_vec, max_tokens, *args, **kwargs)
        except AssertionError as e:
            if "exceed" not in str(e) or "max_tokens" not in str(e) or max_tokens is None:
                raise
            raise _too_long_for_a_batch(e, indices, num_tokens_fn, num_tokens_vec, max_tokens) from e
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
