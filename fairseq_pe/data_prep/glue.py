"""``fairseq-pe-prepare-glue``: GLUE tsv files to the inputs of fairseq's ``sentence_prediction`` task.

Usage::

    fairseq-pe-prepare-glue --glue-dir ../shared/data/glue --tasks SST-2,CoLA,MRPC,RTE,STS-B,WNLI \\
        --spm-model DEST/spm.model --dict DEST/dict.txt --destdir glue-bin
        [--max-positions 512] [--limit N] [--workers 1] [--mrpc-dev-size 408] [--mrpc-dev-seed 1]

``--spm-model`` and ``--dict`` are the sentencepiece model and the fairseq dictionary of its pieces
that the model was pretrained with (``fairseq-pe-prepare-mono`` writes both).  For each task the
output is, as fairseq's ``examples/roberta/preprocess_GLUE_tasks.sh`` writes it:

* ``DESTDIR/TASK/{train,valid,test}.input0`` (and ``.input1`` for sentence pairs): the sentences
  as space-separated sentencepiece pieces, one per line; ``.raw.input0/1``: the raw sentences;
  ``.label``: the raw labels (STS-B: the 0-5 scores).
* ``DESTDIR/TASK-bin/input0/{train,valid,test}.{bin,idx}`` + ``dict.txt`` (and ``input1``),
  binarised with fairseq's ``fairseq-preprocess --only-source --srcdict DICT`` (run in-process).
  Each sentence ends with ``</s>`` as ``fairseq-preprocess`` appends it; nothing else is added:
  ``sentence_prediction`` itself prepends ``<s>`` (``--init-token 0``) and, for pairs, a
  separator before the second sentence (``--separator-token 2``), giving RoBERTa's
  ``<s> A </s> </s> B </s>``.
* ``DESTDIR/TASK-bin/label/``: classification: the labels binarised with their own dictionary
  ``label/dict.txt``, whose order is fixed (class index i = i-th line: ``0``, ``1`` for SST-2,
  CoLA, MRPC, WNLI; ``entailment``, ``not_entailment`` for RTE), not by frequency as in fairseq's
  script.  STS-B: ``label/{split}.label``, the scores divided by 5 (range [0, 1], as fairseq's
  script does), read by ``sentence_prediction --regression-target --num-classes 1``.
* ``DESTDIR/TASK-bin/task.json``: the task, the number of classes, regression or not, the class
  labels, the metric(s), the split sizes, the length statistics and the recommended
  ``fairseq-train`` flags (``fairseq_train_args``), plus the RoBERTa fine-tuning
  hyper-parameters of fairseq's ``examples/roberta/config/finetuning/TASK.yaml``.

Input files, per task (``--glue-dir``), all labelled; read as tab-separated values with
``csv.QUOTE_NONE`` (GLUE sentences hold unbalanced ``"``; a csv reader that honours quotes would
merge lines).  Every file's row count is checked against its line count; a row with the wrong
number of fields, an empty sentence or an unknown label is an error naming the file and line.

============  ===================================================  =============================
task          train / valid / test                                 columns
============  ===================================================  =============================
SST-2         train.tsv / dev.tsv / test-labeled.tsv (or test.tsv)  header ``sentence label``
CoLA          train.tsv / dev.tsv / test.tsv if present             no header: ``sentence label``
                                                                    (or GLUE's 4 columns
                                                                    ``source label * sentence``)
MRPC          msr_paraphrase_train.txt minus the held-out dev /     header ``Quality #1 ID #2 ID
              held out of train / msr_paraphrase_test.txt           #1 String #2 String``
              (GLUE's train.tsv / dev.tsv / test.tsv if present)
RTE, WNLI     train.tsv / dev.tsv / test.tsv                        header ``index sentence1
                                                                    sentence2 label``
STS-B         original/sts-{train,dev,test}.tsv (or GLUE's          no header: ``genre file year
              train/dev/test.tsv, header ``... sentence1            id score sentence1 sentence2
              sentence2 score``)                                    [licence fields]``
============  ===================================================  =============================

A test file without a label column (GLUE's public test sets) gives inputs without labels (no
``label/test*``): predictions can be made, metrics not.

**MRPC has no dev file** in Microsoft's release: ``--mrpc-dev-size`` (408, the size of GLUE's MRPC
dev set) training pairs are held out as the valid split, chosen by a seeded permutation
(``numpy.random.RandomState(--mrpc-dev-seed)``, default 1) of the training rows; both parts keep
the file order.  The held-out line numbers are printed and written to ``DESTDIR/MRPC/dev-lines.txt``.
``--mrpc-dev-ids FILE`` (GLUE's ``mrpc_dev_ids.tsv``: ``#1 ID<TAB>#2 ID`` per line; used by
default when ``MRPC/mrpc_dev_ids.tsv`` exists) holds out exactly those pairs instead (each must be
found in the training file).  A folder made by GLUE's download script, with ``train.tsv`` and
``dev.tsv``, is used as it is (``train.tsv``, not ``msr_paraphrase_train.txt``, which holds the
dev pairs too).

Sentences longer than ``--max-positions`` (default 512, counting ``<s>``, separator and ``</s>``
tokens as ``sentence_prediction`` builds them) are counted and reported, never dropped or
truncated.  Fine-tuning with a smaller ``--max-positions`` then fails on them in the valid/test
sets (fairseq raises) and fairseq-train skips them in the training set with a warning; use
``--shorten-method truncate`` there if truncation is what you want.

``--limit N`` keeps the first N examples of every split (tests and demos).

``DESTDIR/TASK`` and ``DESTDIR/TASK-bin`` are built in hidden ``.part`` folders that replace them
only when complete (``TASK-bin/task.json`` written last).  Folders of an earlier run are replaced
only with ``--force``; a folder not written by this tool (no ``task.json``), or one holding an
input (``--dict``, ``--spm-model``, the GLUE files), is never replaced.
"""

import argparse
import csv
import logging
import os
import shutil
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_pe.errors import UserError, cli
from fairseq_pe.outputs import write_json

SPLITS = ("train", "valid", "test")


class GlueError(UserError):
    """Bad input: the message names the file and line, or the flag."""


def log(msg: str = ""):
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------------
# task definitions
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSpec:
    name: str
    pair: bool
    labels: Optional[Tuple[str, ...]]  # class order; None: regression
    metric: str  # the main metric (a key of fairseq_pe.bert.glue.glue_metrics)
    metrics: Tuple[str, ...]
    files: Dict[str, Tuple[str, ...]]  # split -> candidate paths relative to the task folder
    # header column names: text0, text1, label (alternatives)
    header_text0: Tuple[str, ...] = ()
    header_text1: Tuple[str, ...] = ()
    header_label: Tuple[str, ...] = ()
    # headerless layouts: number of fields -> (text0, text1, label) column indices;
    # key -N: at least N fields
    positional: Dict[int, Tuple[int, Optional[int], int]] = field(default_factory=dict)
    # RoBERTa fine-tuning hyper-parameters of fairseq's examples/roberta/config/finetuning/*.yaml
    recipe: Optional[dict] = None

    @property
    def regression(self) -> bool:
        return self.labels is None

    @property
    def num_classes(self) -> int:
        return 1 if self.regression else len(self.labels)


def _recipe(yaml, lr, batch_size, max_update, warmup_updates):
    return {"lr": lr, "batch_size": batch_size, "max_update": max_update, "warmup_updates": warmup_updates,
            "max_epoch": 10, "source": f"fairseq examples/roberta/config/finetuning/{yaml}"}


TASKS: Dict[str, TaskSpec] = {
    t.name: t
    for t in [
        TaskSpec("SST-2", pair=False, labels=("0", "1"), metric="accuracy", metrics=("accuracy",),
                 files={"train": ("train.tsv",), "valid": ("dev.tsv",), "test": ("test-labeled.tsv", "test.tsv")},
                 header_text0=("sentence",), header_label=("label",),
                 recipe=_recipe("sst_2.yaml", 1e-5, 32, 20935, 1256)),
        TaskSpec("CoLA", pair=False, labels=("0", "1"), metric="mcc", metrics=("mcc", "accuracy"),
                 files={"train": ("train.tsv",), "valid": ("dev.tsv",), "test": ("test-labeled.tsv", "test.tsv")},
                 header_text0=("sentence",), header_label=("label",),
                 positional={2: (0, None, 1), 4: (3, None, 1)},
                 recipe=_recipe("cola.yaml", 1e-5, 16, 5336, 320)),
        TaskSpec("MRPC", pair=True, labels=("0", "1"), metric="f1", metrics=("f1", "accuracy"),
                 files={"train": ("msr_paraphrase_train.txt", "train.tsv"), "valid": ("dev.tsv",),
                        "test": ("msr_paraphrase_test.txt", "test.tsv")},
                 header_text0=("#1 String",), header_text1=("#2 String",), header_label=("Quality",),
                 recipe=_recipe("mrpc.yaml", 1e-5, 16, 2296, 137)),
        TaskSpec("RTE", pair=True, labels=("entailment", "not_entailment"), metric="accuracy",
                 metrics=("accuracy",),
                 files={"train": ("train.tsv",), "valid": ("dev.tsv",), "test": ("test.tsv",)},
                 header_text0=("sentence1",), header_text1=("sentence2",), header_label=("label",),
                 recipe=_recipe("rte.yaml", 2e-5, 16, 2036, 122)),
        TaskSpec("STS-B", pair=True, labels=None, metric="spearman", metrics=("spearman", "pearson"),
                 files={"train": ("original/sts-train.tsv", "train.tsv"), "valid": ("original/sts-dev.tsv", "dev.tsv"),
                        "test": ("original/sts-test.tsv", "test.tsv")},
                 header_text0=("sentence1",), header_text1=("sentence2",), header_label=("score",),
                 positional={-7: (5, 6, 4)},
                 recipe=_recipe("sts_b.yaml", 2e-5, 16, 3598, 214)),
        TaskSpec("WNLI", pair=True, labels=("0", "1"), metric="accuracy", metrics=("accuracy",),
                 files={"train": ("train.tsv",), "valid": ("dev.tsv",), "test": ("test.tsv",)},
                 header_text0=("sentence1",), header_text1=("sentence2",), header_label=("label",),
                 recipe=None),
    ]
}

STSB_SCALE = 5.0  # STS-B scores (0-5) are divided by this, as fairseq's preprocess_GLUE_tasks.sh does
MRPC_DEV_SIZE = 408  # GLUE's MRPC dev set


def task_spec(name: str) -> TaskSpec:
    for k, spec in TASKS.items():
        if k.lower() == name.strip().lower():
            return spec
    raise GlueError(f"unknown GLUE task {name!r}: expected one of {', '.join(TASKS)}")


def parse_task_list(value: str) -> List[TaskSpec]:
    names = [n for n in value.split(",") if n.strip()]
    if not names:
        raise GlueError("--tasks is empty")
    try:
        specs = [task_spec(n) for n in names]
    except GlueError as e:
        raise GlueError(f"--tasks: {e}") from None
    if len({s.name for s in specs}) != len(specs):
        raise GlueError(f"--tasks names a task twice: {value}")
    return specs


# ----------------------------------------------------------------------------------------------
# reading
# ----------------------------------------------------------------------------------------------


@dataclass
class Example:
    text0: str
    text1: Optional[str]
    label: Optional[str]  # None: unlabelled
    path: str
    line: int  # 1-based line number in ``path``
    extra: Dict[str, str] = field(default_factory=dict)  # e.g. MRPC's "#1 ID"/"#2 ID"


def count_lines(path: str) -> int:
    """Lines as ``wc -l`` counts them, plus a last line without its newline."""
    with open(path, "rb") as f:
        data = f.read()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def read_tsv(path: str) -> List[Tuple[int, List[str]]]:
    """(line number, fields) of every row, read with ``csv.QUOTE_NONE``; a UTF-8 BOM is dropped.

    CRLF line ends are accepted.  The number of rows must equal the number of lines (a stray
    carriage return inside a line would split it), and no line may be empty.
    """
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE, strict=True))
    except UnicodeDecodeError as e:
        raise GlueError(f"{path}: not UTF-8 ({e})") from None
    except csv.Error as e:
        raise GlueError(f"{path}: {e}") from None
    n_lines = count_lines(path)
    if len(rows) != n_lines:
        raise GlueError(f"{path}: {n_lines} lines but {len(rows)} tab-separated rows "
                        "(a carriage return inside a line?)")
    out = []
    for i, row in enumerate(rows, 1):
        if not row:
            raise GlueError(f"{path}:{i}: empty line")
        out.append((i, row))
    return out


def _find_column(header: List[str], names: Sequence[str]) -> Optional[int]:
    for n in names:
        if n in header:
            return header.index(n)
    return None


def parse_file(spec: TaskSpec, path: str, split: str) -> List[Example]:
    """The examples of one GLUE file (see the module docstring for the layouts)."""
    rows = read_tsv(path)
    if not rows:
        raise GlueError(f"{path}: empty file")
    first = [c.strip() for c in rows[0][1]]
    c0 = _find_column(first, spec.header_text0)
    if c0 is not None:  # a header row
        c1 = _find_column(first, spec.header_text1) if spec.pair else None
        cl = _find_column(first, spec.header_label)
        if spec.pair and c1 is None:
            raise GlueError(f"{path}:1: the header names no second-sentence column "
                            f"({' or '.join(spec.header_text1)}): {rows[0][1]}")
        if cl is None and split != "test":
            raise GlueError(f"{path}:1: the header names no label column ({' or '.join(spec.header_label)}): "
                            f"{rows[0][1]} (only a test split may be unlabelled)")
        n_fields = len(first)
        body = rows[1:]
        layout = lambda row: (c0, c1, cl)  # noqa: E731
        id_cols = {n: first.index(n) for n in ("#1 ID", "#2 ID") if n in first}
    else:
        if not spec.positional:
            raise GlueError(f"{path}:1: expected a header naming {' or '.join(spec.header_text0)}, found {rows[0][1]}")
        n_fields = None
        body = rows
        id_cols = {}

        def layout(row):
            cols = spec.positional.get(len(row))
            if cols is None:
                at_least = [k for k in spec.positional if k < 0 and len(row) >= -k]
                cols = spec.positional[at_least[0]] if at_least else None
            return cols

    examples = []
    for line, row in body:
        if n_fields is not None and len(row) != n_fields:
            raise GlueError(f"{path}:{line}: {len(row)} tab-separated fields, the header has {n_fields}")
        cols = layout(row)
        if cols is None:
            want = ", ".join(f"at least {-k}" if k < 0 else str(k) for k in spec.positional)
            raise GlueError(f"{path}:{line}: {len(row)} tab-separated fields, expected {want} for {spec.name}")
        i0, i1, il = cols
        text0 = row[i0]
        text1 = row[i1] if i1 is not None else None
        for t, which in ((text0, "first"), (text1, "second")):
            if t is not None and not t.strip():
                raise GlueError(f"{path}:{line}: empty {which} sentence")
        label = None
        if il is not None:
            label = row[il].strip()
            if spec.regression:
                try:
                    score = float(label)
                except ValueError:
                    raise GlueError(f"{path}:{line}: score {label!r} is not a number") from None
                if not 0.0 <= score <= 5.0:
                    raise GlueError(f"{path}:{line}: score {label!r} is outside [0, 5]")
            elif label not in spec.labels:
                raise GlueError(f"{path}:{line}: label {label!r} is not one of {', '.join(spec.labels)}")
        examples.append(Example(text0, text1, label, path, line, {k: row[c] for k, c in id_cols.items()}))
    if not examples:
        raise GlueError(f"{path}: no examples")
    return examples


def locate(spec: TaskSpec, task_dir: str, split: str) -> Optional[str]:
    for rel in spec.files[split]:
        p = os.path.join(task_dir, rel)
        if os.path.isfile(p):
            return p
    return None


def mrpc_holdout(train: List[Example], dev_size: int, seed: int,
                 dev_ids: Optional[str] = None) -> Tuple[List[Example], List[Example]]:
    """Split MRPC's training file into (train, dev), both in file order.

    ``dev_ids``: a file of ``#1 ID<TAB>#2 ID`` lines (GLUE's ``mrpc_dev_ids.tsv``); else the first
    ``dev_size`` indices of ``numpy.random.RandomState(seed).permutation(len(train))``.
    """
    import numpy as np

    if dev_ids is not None:
        wanted = []
        for line, row in read_tsv(dev_ids):
            if len(row) != 2:
                raise GlueError(f"{dev_ids}:{line}: expected '#1 ID<TAB>#2 ID', found {len(row)} fields")
            wanted.append((row[0].strip(), row[1].strip()))
        index = {(e.extra.get("#1 ID"), e.extra.get("#2 ID")): i for i, e in enumerate(train)}
        missing = [w for w in wanted if w not in index]
        if missing:
            raise GlueError(f"--mrpc-dev-ids {dev_ids}: {len(missing)} pairs are not in the training file, "
                            f"e.g. {missing[0]}")
        held = {index[w] for w in wanted}
    else:
        if not 0 < dev_size < len(train):
            raise GlueError(f"--mrpc-dev-size {dev_size}: must be between 1 and {len(train) - 1} "
                            f"(the training file has {len(train)} pairs)")
        held = set(np.random.RandomState(seed).permutation(len(train))[:dev_size].tolist())
    return ([e for i, e in enumerate(train) if i not in held], [e for i, e in enumerate(train) if i in held])


def read_task(spec: TaskSpec, glue_dir: str, mrpc_dev_size: int = MRPC_DEV_SIZE, mrpc_dev_seed: int = 1,
              mrpc_dev_ids: Optional[str] = None) -> Tuple[Dict[str, List[Example]], Dict[str, str]]:
    """{split: examples} and {split: description of its source} of one task."""
    task_dir = os.path.join(glue_dir, spec.name)
    if not os.path.isdir(task_dir):
        raise GlueError(f"--glue-dir {glue_dir}: no folder {spec.name}/")
    data, sources = {}, {}
    mrpc_glue_split = spec.name == "MRPC" and locate(spec, task_dir, "valid") is not None
    for split in SPLITS:
        path = locate(spec, task_dir, split)
        if mrpc_glue_split and split == "train":
            # GLUE's MRPC folder also holds Microsoft's files: its dev.tsv pairs are in
            # msr_paraphrase_train.txt, so the training file must be GLUE's train.tsv
            path = os.path.join(task_dir, "train.tsv")
            if not os.path.isfile(path):
                raise GlueError(f"{task_dir}: dev.tsv (GLUE's MRPC dev split) without GLUE's train.tsv: the dev "
                                "pairs would also be in msr_paraphrase_train.txt; remove dev.tsv to hold out a "
                                "dev split of msr_paraphrase_train.txt instead")
        if path is None:
            if split == "train":
                raise GlueError(f"{task_dir}: no training file ({' or '.join(spec.files['train'])})")
            if split == "valid" and spec.name == "MRPC":
                continue  # held out below
            if split == "valid":
                raise GlueError(f"{task_dir}: no dev file ({' or '.join(spec.files['valid'])})")
            continue
        data[split] = parse_file(spec, path, split)
        sources[split] = path
    if "valid" not in data:  # MRPC without GLUE's dev.tsv
        n = len(data["train"])
        glue_ids = os.path.join(task_dir, "mrpc_dev_ids.tsv")
        if mrpc_dev_ids is None and os.path.isfile(glue_ids):
            mrpc_dev_ids = glue_ids  # GLUE's own dev pairs
        data["train"], data["valid"] = mrpc_holdout(data["train"], mrpc_dev_size, mrpc_dev_seed, mrpc_dev_ids)
        how = (f"the pairs of --mrpc-dev-ids {mrpc_dev_ids}" if mrpc_dev_ids else
               f"numpy.random.RandomState({mrpc_dev_seed}).permutation({n})[:{mrpc_dev_size}]")
        sources["valid"] = f"{sources['train']} (held out: {how})"
        sources["train"] = f"{sources['train']} (without the held-out dev pairs)"
    order = [s for s in SPLITS if s in data]
    return {s: data[s] for s in order}, {s: sources[s] for s in order}


# ----------------------------------------------------------------------------------------------
# encoding and binarising
# ----------------------------------------------------------------------------------------------


def load_dictionary(path: str):
    from fairseq.data import Dictionary

    if not os.path.isfile(path):
        raise GlueError(f"--dict {path}: no such file")
    try:
        return Dictionary.load(path)
    except Exception as e:  # fairseq raises ValueError/RuntimeError on a malformed line
        raise GlueError(f"--dict {path}: not a fairseq dictionary ({e})") from None


def load_spm(path: str):
    import sentencepiece as spm

    if not os.path.isfile(path):
        raise GlueError(f"--spm-model {path}: no such file")
    try:
        return spm.SentencePieceProcessor(model_file=path)
    except Exception as e:
        raise GlueError(f"--spm-model {path}: not a sentencepiece model ({e})") from None


def check_dict_matches_spm(d, sp, dict_path: str, spm_path: str):
    """The dictionary must be made of the model's pieces (fairseq's padding symbols aside)."""
    symbols = [s for s in d.symbols[d.nspecial:] if not s.startswith("madeupword") and s != "<mask>"]
    if not symbols:
        raise GlueError(f"--dict {dict_path}: no symbols")
    unk = sp.unk_id()
    foreign = [s for s in symbols if sp.piece_to_id(s) == unk and s != sp.id_to_piece(unk)]
    if len(foreign) > 0.05 * len(symbols):
        raise GlueError(f"--dict {dict_path}: {len(foreign)} of its {len(symbols)} symbols are not pieces of "
                        f"--spm-model {spm_path} (e.g. {foreign[:3]}): the dictionary was not built from this model")


def encode(sp, texts: Sequence[str]) -> List[List[str]]:
    return sp.encode(list(texts), out_type=str)


def write_lines(path: str, lines: Sequence[str]):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            if "\n" in line or "\r" in line:
                raise GlueError(f"{path}: a line break inside an example")
            f.write(line + "\n")


def fairseq_preprocess(srcdict: str, destdir: str, prefixes: Dict[str, str], workers: int = 1):
    """``fairseq-preprocess --only-source --srcdict SRCDICT`` (fairseq's own ``main``, in-process)."""
    from fairseq import options
    from fairseq_cli import preprocess

    argv = ["--only-source", "--srcdict", srcdict, "--destdir", destdir, "--workers", str(workers)]
    for split, flag in (("train", "--trainpref"), ("valid", "--validpref"), ("test", "--testpref")):
        if split in prefixes:
            argv += [flag, prefixes[split]]
    args = options.get_preprocessing_parser().parse_args(argv)
    logger = logging.getLogger("fairseq_cli.preprocess")
    handlers, level = list(logger.handlers), logger.level
    logger.setLevel(logging.WARNING)
    try:
        preprocess.main(args)
    finally:
        for h in logger.handlers:
            if h not in handlers:
                logger.removeHandler(h)
                h.close()
        logger.setLevel(level)


def check_binarised(prefix: str, d, expected_sizes: Sequence[int]):
    """The .bin/.idx pair holds one entry per example, of the expected length."""
    from fairseq.data import data_utils

    logger = logging.getLogger(data_utils.__name__)
    level = logger.level
    logger.setLevel(logging.WARNING)  # no "loaded N examples" lines
    try:
        ds = data_utils.load_indexed_dataset(prefix, d)
    finally:
        logger.setLevel(level)
    if ds is None:
        raise GlueError(f"{prefix}.idx/.bin were not written")
    if len(ds) != len(expected_sizes) or list(ds.sizes) != list(expected_sizes):
        raise GlueError(f"{prefix}: binarised {len(ds)} entries, expected {len(expected_sizes)} "
                        "(or their lengths differ)")


@dataclass
class SplitStats:
    n: int
    labels: Dict[str, int]
    unk_pieces: int
    pieces: int
    max_len: int
    too_long: int
    too_long_lines: List[str]


def recommended_args(spec: TaskSpec, max_positions: int) -> List[str]:
    args = ["--task", "sentence_prediction", "--num-classes", str(spec.num_classes),
            "--init-token", "0", "--separator-token", "2", "--max-positions", str(max_positions),
            "--criterion", "sentence_prediction", "--required-batch-size-multiple", "1",
            "--reset-optimizer", "--reset-dataloader", "--reset-meters"]
    if spec.regression:
        args += ["--regression-target", "--report-pearson-and-spearman"]
    elif spec.metric == "mcc":
        args += ["--report-mcc"]
    elif spec.metric == "f1":
        args += ["--report-acc-and-f1"]
    args += ["--best-checkpoint-metric", spec.metric, "--maximize-best-checkpoint-metric"]
    return args


def prepare_task(spec: TaskSpec, args: argparse.Namespace, sp, d) -> dict:
    log(f"== {spec.name} ({'sentence pairs' if spec.pair else 'single sentences'}, "
        f"{'regression' if spec.regression else f'{spec.num_classes} classes'})")
    data, sources = read_task(spec, args.glue_dir, args.mrpc_dev_size, args.mrpc_dev_seed, args.mrpc_dev_ids)
    for split in data:
        log(f"  {split}: {len(data[split]):,} examples from {sources[split]}")
    if spec.name == "MRPC" and "held out" in sources["valid"]:
        log(f"  MRPC has no dev file: {len(data['valid'])} training pairs held out as valid "
            f"(lines {', '.join(str(e.line) for e in data['valid'][:5])}, ... of {data['valid'][0].path}); "
            "the list is in MRPC/dev-lines.txt")
    if args.limit:
        for split in data:
            if len(data[split]) > args.limit:
                data[split] = data[split][: args.limit]
        log(f"  --limit {args.limit}: " + ", ".join(f"{s} {len(v):,}" for s, v in data.items()))
    for split in ("train", "valid"):
        if data[split][0].label is None:
            raise GlueError(f"{sources[split]}: the {split} split has no labels")

    final_text_dir, final_bin_dir = check_task_folders(spec, args)
    # built in hidden .part folders, which replace the final ones when complete
    text_dir, bin_dir = (os.path.join(args.destdir, f".{os.path.basename(p)}.part")
                         for p in (final_text_dir, final_bin_dir))
    for p in (text_dir, bin_dir):
        shutil.rmtree(p, ignore_errors=True)
        os.makedirs(p)
    if spec.name == "MRPC" and "held out" in sources["valid"]:
        write_lines(os.path.join(text_dir, "dev-lines.txt"), [str(e.line) for e in data["valid"]])

    inputs = ("input0", "input1") if spec.pair else ("input0",)
    stats: Dict[str, SplitStats] = {}
    lengths: Dict[Tuple[str, str], List[int]] = {}
    for split, exs in data.items():
        total = [2 if spec.pair else 1] * len(exs)  # <s> (+ the separator)
        unk = pieces_n = 0
        for k, inp in enumerate(inputs):
            texts = [e.text0 if k == 0 else e.text1 for e in exs]
            pieces = encode(sp, texts)
            for e, p in zip(exs, pieces):
                if not p:
                    raise GlueError(f"{e.path}:{e.line}: the sentence encodes to no sentencepiece piece")
            write_lines(os.path.join(text_dir, f"{split}.raw.{inp}"), texts)
            write_lines(os.path.join(text_dir, f"{split}.{inp}"), [" ".join(p) for p in pieces])
            lengths[split, inp] = [len(p) + 1 for p in pieces]  # + </s>
            total = [t + n for t, n in zip(total, lengths[split, inp])]
            unk += sum(1 for p in pieces for piece in p if d.index(piece) == d.unk())
            pieces_n += sum(len(p) for p in pieces)
        labelled = exs[0].label is not None
        if labelled and any(e.label is None for e in exs):
            raise GlueError(f"{sources[split]}: some rows have labels and some have none")
        if labelled:
            write_lines(os.path.join(text_dir, f"{split}.label"), [e.label for e in exs])
        long_ = [f"{e.path}:{e.line} ({t} tokens)" for e, t in zip(exs, total) if t > args.max_positions]
        stats[split] = SplitStats(len(exs), dict(sorted(Counter(e.label for e in exs if labelled).items())),
                                  unk, pieces_n, max(total), len(long_), long_)

    for inp in inputs:
        dest = os.path.join(bin_dir, inp)
        fairseq_preprocess(args.dict, dest, {s: os.path.join(text_dir, f"{s}.{inp}") for s in data}, args.workers)
        for s in data:
            check_binarised(os.path.join(dest, s), d, lengths[s, inp])

    labelled_splits = [s for s in data if data[s][0].label is not None]
    label_dir = os.path.join(bin_dir, "label")
    os.makedirs(label_dir, exist_ok=True)
    if spec.regression:
        for s in labelled_splits:
            write_lines(os.path.join(label_dir, f"{s}.label"),
                        [repr(float(e.label) / STSB_SCALE) for e in data[s]])
    else:
        from fairseq.data import Dictionary

        counts = Counter(e.label for e in data["train"])
        label_dict_path = os.path.join(text_dir, "label.dict.txt")
        write_lines(label_dict_path, [f"{lab} {counts.get(lab, 0)}" for lab in spec.labels])
        fairseq_preprocess(label_dict_path, label_dir,
                           {s: os.path.join(text_dir, f"{s}.label") for s in labelled_splits}, args.workers)
        ld = Dictionary.load(os.path.join(label_dir, "dict.txt"))
        if [ld[i + ld.nspecial] for i in range(spec.num_classes)] != list(spec.labels):
            raise GlueError(f"{label_dir}/dict.txt: the class order differs from {spec.labels}")
        for s in labelled_splits:
            check_binarised(os.path.join(label_dir, s), ld, [2] * len(data[s]))

    for split, st in stats.items():
        dist = ", ".join(f"{k}: {v:,}" for k, v in st.labels.items()) if not spec.regression else \
            ("scores 0-5" if st.labels else "")
        dist = dist or "unlabelled"
        log(f"  {split:5s} {st.n:7,} examples ({dist}); longest {st.max_len} tokens; "
            f"<unk> {100.0 * st.unk_pieces / max(1, st.pieces):.2f}% of {st.pieces:,} pieces")
        if st.too_long:
            log(f"  WARNING: {split}: {st.too_long} examples longer than --max-positions {args.max_positions} "
                f"(kept, not truncated): {'; '.join(st.too_long_lines[:5])}{' ...' if st.too_long > 5 else ''}")
    info = {
        "task": spec.name,
        "num_classes": spec.num_classes,
        "regression_target": spec.regression,
        "labels": list(spec.labels) if spec.labels else None,
        "label_scale": STSB_SCALE if spec.regression else None,
        "pair": spec.pair,
        "metric": spec.metric,
        "metrics": list(spec.metrics),
        "splits": {s: st.n for s, st in stats.items()},
        "labelled_splits": labelled_splits,
        "label_counts": {s: st.labels for s, st in stats.items() if not spec.regression},
        "sources": sources,
        "limit": args.limit,
        "max_positions": args.max_positions,
        "longest": {s: st.max_len for s, st in stats.items()},
        "longer_than_max_positions": {s: st.too_long for s, st in stats.items()},
        "spm_model": os.path.abspath(args.spm_model),
        "dict": os.path.abspath(args.dict),
        "fairseq_train_args": recommended_args(spec, args.max_positions),
        "roberta_recipe": spec.recipe,
    }
    write_json(os.path.join(bin_dir, "task.json"), info)
    # TASK-bin (with task.json) first: an interruption between the two leaves folders known as this tool's
    for part, final in ((bin_dir, final_bin_dir), (text_dir, final_text_dir)):
        shutil.rmtree(final, ignore_errors=True)  # checked above: an earlier run's, and --force
        os.rename(part, final)
    log(f"  classes: {spec.num_classes}{' (regression: --regression-target, scores / 5)' if spec.regression else ' ' + str(list(spec.labels))}; "
        f"wrote {final_bin_dir}")
    return info


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_task_folders(spec: TaskSpec, args: argparse.Namespace) -> Tuple[str, str]:
    """``DESTDIR/TASK`` and ``DESTDIR/TASK-bin``, which this run replaces: never a folder that holds
    an input or that this tool did not write, and an earlier run's only with ``--force``."""
    text_dir = os.path.join(args.destdir, spec.name)
    bin_dir = os.path.join(args.destdir, spec.name + "-bin")
    inputs = [("--glue-dir", args.glue_dir), ("--glue-dir", os.path.join(args.glue_dir, spec.name)),
              ("--spm-model", args.spm_model), ("--dict", args.dict)]
    if args.mrpc_dev_ids:
        inputs.append(("--mrpc-dev-ids", args.mrpc_dev_ids))
    for p in (text_dir, bin_dir):
        for flag, path in inputs:
            if _inside(path, p):
                raise GlueError(f"--destdir {args.destdir}: {p} would replace the input {flag} {path}; "
                                "choose another --destdir")
    ours = os.path.isfile(os.path.join(bin_dir, "task.json"))
    for p in (text_dir, bin_dir):
        if os.path.exists(p) and (not os.path.isdir(p) or os.listdir(p)):
            if not ours:
                raise GlueError(f"--destdir: {p} exists and was not written by fairseq-pe-prepare-glue "
                                "(no task.json); remove it or choose another --destdir")
            if not args.force:
                raise GlueError(f"--destdir: {p} holds an earlier run's {spec.name} data: pass --force to "
                                "replace it, or choose another --destdir")
    return text_dir, bin_dir


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fairseq-pe-prepare-glue", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--glue-dir", required=True, help="folder holding SST-2/, CoLA/, MRPC/, RTE/, STS-B/, WNLI/")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated (default: {','.join(TASKS)})")
    p.add_argument("--spm-model", required=True, help="sentencepiece model (e.g. fairseq-pe-prepare-mono's spm.model)")
    p.add_argument("--dict", required=True, help="fairseq dictionary of the pieces (the pretraining data's dict.txt)")
    p.add_argument("--destdir", required=True, help="output folder: DESTDIR/TASK-bin, DESTDIR/TASK")
    p.add_argument("--max-positions", type=int, default=512,
                   help="report examples longer than this, <s>/separator/</s> included (default 512); none is dropped")
    p.add_argument("--limit", type=int, default=0, help="keep the first N examples of every split (0: all)")
    p.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers (default 1)")
    p.add_argument("--mrpc-dev-size", type=int, default=MRPC_DEV_SIZE,
                   help=f"MRPC training pairs held out as valid when there is no dev file (default {MRPC_DEV_SIZE})")
    p.add_argument("--mrpc-dev-seed", type=int, default=1, help="seed of the MRPC hold-out permutation (default 1)")
    p.add_argument("--mrpc-dev-ids", default=None, help="GLUE's mrpc_dev_ids.tsv: hold out exactly these pairs")
    p.add_argument("--force", action="store_true",
                   help="replace the DESTDIR/TASK and DESTDIR/TASK-bin folders of an earlier run")
    args = p.parse_args(argv)
    if args.max_positions < 3:
        p.error("--max-positions must be at least 3")
    if args.limit < 0:
        p.error("--limit must be >= 0")
    if args.workers < 1:
        p.error("--workers must be >= 1")
    return args


def prepare(args: argparse.Namespace) -> Dict[str, dict]:
    specs = parse_task_list(args.tasks)
    if not os.path.isdir(args.glue_dir):
        raise GlueError(f"--glue-dir {args.glue_dir}: no such folder")
    sp = load_spm(args.spm_model)
    d = load_dictionary(args.dict)
    check_dict_matches_spm(d, sp, args.dict, args.spm_model)
    log(f"sentencepiece {args.spm_model} ({sp.get_piece_size():,} pieces); dictionary {args.dict} ({len(d):,} symbols)")
    for spec in specs:  # every task's folders checked before any is written
        check_task_folders(spec, args)
    os.makedirs(args.destdir, exist_ok=True)
    out = {}
    for spec in specs:
        try:
            out[spec.name] = prepare_task(spec, args, sp, d)
        except BaseException:  # a failed or interrupted task leaves no half folder behind
            for name in (spec.name, spec.name + "-bin"):
                shutil.rmtree(os.path.join(args.destdir, f".{name}.part"), ignore_errors=True)
            raise
    log("\nsummary")
    for name, info in out.items():
        sizes = ", ".join(f"{s} {n:,}" for s, n in info["splits"].items())
        log(f"  {name:6s} {sizes}; {info['num_classes']} {'target (regression)' if info['regression_target'] else 'classes'}; "
            f"metric {info['metric']}")
    log("fine-tune with: fairseq-train DESTDIR/TASK-bin --user-dir fairseq_pe --restore-file PRETRAINED.pt "
        "$(the fairseq_train_args of DESTDIR/TASK-bin/task.json) ...")
    return out


@cli
def main(argv: Optional[List[str]] = None) -> int:
    """A :class:`GlueError` ends as ``fairseq-pe-prepare-glue: error: ...``, status 2."""
    prepare(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
