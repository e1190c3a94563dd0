"""Fix 9: ``--sample-break-mode eos`` and language-model generation on numpy 2.

fairseq 0.12's ``TokenBlockDataset._build_slice_indices`` builds the block index of break mode ``eos`` with
``np.compat.long``, which numpy 2.0 removed: ``fairseq-interactive`` and the hub's ``sample`` on a language model
(``language_modeling``'s ``build_dataset_for_inference`` uses that mode), and any training or evaluation with
``--sample-break-mode eos``, stop with ``AttributeError: module 'numpy' has no attribute 'compat'``.  For that mode
the index is built here as fairseq builds it (block i is sentence i: starting index i, offset 0, ending index i), in
int64, numpy 1's ``np.compat.long`` on the 64-bit platforms fairseq supports; the other modes are fairseq's own.

Extension point: none; a static method of the dataset (a wrapper, once).
"""

import functools

from fairseq_pe.compat.patching import fairseq_matches, patch

#: the fairseq releases this fix is written for
FIXES_FAIRSEQ = ("0.12.",)
#: it changes stock fairseq's behaviour for every task of the process (docs/install.md lists it)
CHANGES_STOCK = True
SUMMARY = "--sample-break-mode eos (language-model generation) works on numpy 2 (fairseq used np.compat.long)"


def _eos_blocks_on_numpy2(build_slice_indices):
    """Break mode ``eos`` without ``np.compat`` (module docstring); every other mode is fairseq's."""
    @functools.wraps(build_slice_indices)
    def wrapper(sizes, break_mode, document_sep_len, block_size):
        import numpy as np

        if break_mode != "eos" or hasattr(np, "compat"):
            return build_slice_indices(sizes, break_mode, document_sep_len, block_size)
        from fairseq.data.token_block_utils_fast import _get_slice_indices_fast

        sizes = np.asarray(sizes.numpy() if hasattr(sizes, "numpy") else sizes).astype(np.int64)
        slice_indices = _get_slice_indices_fast(sizes, "eos", 0 if block_size is None else block_size,
                                                document_sep_len)
        count = len(sizes)
        block_to_dataset_index = np.stack([np.arange(count), np.zeros(count, dtype=np.int64), np.arange(count)], 1)
        return slice_indices[:, 1] - slice_indices[:, 0], block_to_dataset_index, slice_indices

    wrapper._fairseq_pe_patched = True
    return staticmethod(wrapper)


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "numpy2_eos_blocks",
                           "--sample-break-mode eos stops on numpy 2 (np.compat.long)"):
        return False
    from fairseq.data.token_block_dataset import TokenBlockDataset

    patch(TokenBlockDataset, "_build_slice_indices", _eos_blocks_on_numpy2)
    return True
