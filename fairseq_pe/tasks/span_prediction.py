"""``--task span_prediction``: extractive question answering (SQuAD v1.1 / v2.0) on a RoBERTa encoder.

Data: the output of ``fairseq-pe-prepare-squad`` (:mod:`fairseq_pe.data_prep.squad`)::

    DATA/input0/dict.txt              the pretrained model's dictionary
    DATA/input0/SPLIT.{bin,idx}       features "<s> question </s> </s> context-window </s>"
    DATA/SPLIT.spans                  "start end" per feature: positions in the feature, 0 0 = no answer
    DATA/SPLIT.features.jsonl         question id and character offsets per feature (for prediction)

The features carry their specials: index 0 is ``<s>`` (checked on loading), as the ``masked_lm``
pretraining task prepends it, so nothing is added here and the labels index the stored sequence.
As fairseq's ``masked_lm`` and ``sentence_prediction`` tasks do, ``<mask>`` is appended to the
dictionary, so the vocabulary matches a model pretrained with ``--task masked_lm``.

A batch is ``{"id", "net_input": {"src_tokens" (right-padded), "src_lengths"}, "target_start",
"target_end", "nsentences", "ntokens"}``.  The model gets a span head
(:class:`fairseq_pe.models.span_head.SpanPredictionHead`) named ``--span-head-name`` through
``model.register_span_head``; fine-tune a pretrained masked LM with ``--restore-file CKPT
--reset-optimizer --reset-dataloader --reset-meters`` (the head is new, the model adds its fresh
weights to the loaded state).  The loss is the ``span_prediction`` criterion's.
"""

import contextlib
import logging
import os
from dataclasses import dataclass, field

import numpy as np
from omegaconf import II, MISSING, OmegaConf, open_dict

from fairseq.data import (
    Dictionary,
    IdDataset,
    NestedDictionaryDataset,
    NumelDataset,
    NumSamplesDataset,
    RawLabelDataset,
    RightPadDataset,
    SortDataset,
    data_utils,
)
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task

logger = logging.getLogger(__name__)


@dataclass
class SpanPredictionConfig(FairseqDataclass):
    data: str = field(default=MISSING, metadata={"help": "output directory of fairseq-pe-prepare-squad"})
    max_positions: int = field(
        default=512,
        metadata={"help": "longest feature (tokens, specials included); a longer one in the data is an error "
                          "(prepare with fairseq-pe-prepare-squad --max-length at most this)"})
    span_head_name: str = field(default="span_head", metadata={"help": "name of the span head of the model"})
    no_shuffle: bool = field(default=False, metadata={"help": "keep the features in file order"})
    seed: int = II("common.seed")


def read_spans(path: str, sizes: np.ndarray) -> np.ndarray:
    """``(N, 2)`` int64 labels of ``SPLIT.spans``, checked against the feature lengths ``sizes``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"span labels not found: {path} (written by fairseq-pe-prepare-squad)")
    with open(path, encoding="utf-8") as f:
        rows = [line.split() for line in f]
    if len(rows) != len(sizes):
        raise ValueError(f"{path} has {len(rows)} lines but its split has {len(sizes)} features")
    try:
        spans = np.array([[int(a), int(b)] for a, b in rows], dtype=np.int64).reshape(-1, 2)
    except ValueError as e:
        raise ValueError(f"{path}: every line must be two integers 'start end': {e}") from e
    bad = (spans[:, 0] < 0) | (spans[:, 1] < spans[:, 0]) | (spans[:, 1] >= sizes) \
        | ((spans[:, 0] == 0) != (spans[:, 1] == 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{path}: line {i + 1}: span {tuple(spans[i])} is not 0 0 nor 0 < start <= end < "
                         f"{sizes[i]} (the feature's length); {int(bad.sum())} bad line(s)")
    return spans


def first_tokens(dataset) -> np.ndarray:
    """Token 0 of every item of an indexed dataset (read from the mmap buffer when possible)."""
    try:
        index = dataset._index
        buf = np.frombuffer(dataset._bin_buffer, dtype=index.dtype)
        return buf[np.asarray(index._pointers, dtype=np.int64) // index.dtype().itemsize]
    except AttributeError:
        return np.array([int(dataset[i][0]) for i in range(len(dataset))])


@register_task("span_prediction", dataclass=SpanPredictionConfig)
class SpanPredictionTask(FairseqTask):
    """Start/end span prediction on features of ``fairseq-pe-prepare-squad``."""

    cfg: SpanPredictionConfig

    def __init__(self, cfg: SpanPredictionConfig, dictionary: Dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary

    @classmethod
    def load_dictionary(cls, filename):
        dictionary = Dictionary.load(filename)
        dictionary.add_symbol("<mask>")
        return dictionary

    @classmethod
    def setup_task(cls, cfg: SpanPredictionConfig, **kwargs):
        path = os.path.join(cfg.data, "input0", "dict.txt")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} not found: is {cfg.data} an output directory of "
                                    f"fairseq-pe-prepare-squad?")
        dictionary = cls.load_dictionary(path)
        logger.info(f"[input0] dictionary: {len(dictionary)} types")
        return cls(cfg, dictionary)

    def load_dataset(self, split, combine=False, **kwargs):
        prefix = os.path.join(self.cfg.data, "input0", split)
        src_tokens = data_utils.load_indexed_dataset(prefix, self.source_dictionary, combine=combine)
        if src_tokens is None:
            raise FileNotFoundError(f"split {split!r} not found: {prefix}.{{bin,idx}} (written by "
                                    f"fairseq-pe-prepare-squad --{split} JSON)")
        sizes = np.asarray(src_tokens.sizes)
        if len(sizes) and sizes.max() > self.cfg.max_positions:
            raise ValueError(f"{prefix}: {int((sizes > self.cfg.max_positions).sum())} feature(s) are longer than "
                             f"--max-positions {self.cfg.max_positions} (longest {int(sizes.max())}): raise "
                             f"--max-positions or prepare with a smaller --max-length")
        first = first_tokens(src_tokens)
        if len(first) and (first != self.source_dictionary.bos()).any():
            i = int(np.flatnonzero(first != self.source_dictionary.bos())[0])
            raise ValueError(f"{prefix}: feature {i} does not start with <s> (index "
                             f"{self.source_dictionary.bos()}): not written by fairseq-pe-prepare-squad?")
        spans = read_spans(os.path.join(self.cfg.data, f"{split}.spans"), sizes)

        dataset = {
            "id": IdDataset(),
            "net_input": {
                "src_tokens": RightPadDataset(src_tokens, pad_idx=self.source_dictionary.pad()),
                "src_lengths": NumelDataset(src_tokens, reduce=False),
            },
            "target_start": RawLabelDataset(spans[:, 0].tolist()),
            "target_end": RawLabelDataset(spans[:, 1].tolist()),
            "nsentences": NumSamplesDataset(),
            "ntokens": NumelDataset(src_tokens, reduce=True),
        }
        dataset = NestedDictionaryDataset(dataset, sizes=[sizes])
        if not self.cfg.no_shuffle:
            with data_utils.numpy_seed(self.cfg.seed):
                shuffle = np.random.permutation(len(dataset))
            dataset = SortDataset(dataset, sort_order=[shuffle])
        logger.info(f"loaded {split}: {len(dataset)} features ({int((spans[:, 0] > 0).sum())} with an answer span)")
        self.datasets[split] = dataset
        return dataset

    def build_model(self, cfg, from_checkpoint=False):
        from fairseq import models

        with open_dict(cfg) if OmegaConf.is_config(cfg) else contextlib.ExitStack():
            cfg.max_positions = self.cfg.max_positions
        model = models.build_model(cfg, self, from_checkpoint)
        if not hasattr(model, "register_span_head"):
            raise ValueError(f"--arch {getattr(cfg, 'arch', '?')}: the model has no register_span_head(); "
                             f"span_prediction needs a roberta_pe model")
        model.register_span_head(self.cfg.span_head_name)
        return model

    def max_positions(self):
        return self.cfg.max_positions

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
