"""Random fairseq batches, for the measurement tools (``fairseq-pe-count-ops``, ``fairseq-pe-gpu-check``,
``fairseq-pe-sdpa-arguments``: :mod:`fairseq_pe.benchmark`) and the tests."""

import torch
from fairseq.data import Dictionary, LanguagePairDataset


def random_batch(dictionary: Dictionary, source_lengths, target_lengths, seed: int = 0):
    """fairseq's collated batch of random sentences of these lengths (EOS included), one dictionary for both sides:
    the source left-padded and the target right-padded, as fairseq's translation task batches them."""
    g = torch.Generator().manual_seed(seed)

    def sentence(n):
        return torch.cat([torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=g),
                          torch.tensor([dictionary.eos()])])

    src, tgt = [sentence(n) for n in source_lengths], [sentence(n) for n in target_lengths]
    dataset = LanguagePairDataset(src, [len(s) for s in src], dictionary, tgt, [len(t) for t in tgt], dictionary)
    return dataset.collater([dataset[i] for i in range(len(src))])
