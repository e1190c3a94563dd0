"""GLUE: parsing of the real GLUE files, the official metrics, and an end-to-end run.

* Parsing (in-process, on ../shared/data/glue where it is there): every split's example count
  equals ``wc -l`` minus the header; MRPC's held-out dev split is deterministic and disjoint from
  train; rows with ``"`` (unbalanced quotes) are kept intact; CRLF files and STS-B's licence
  columns are read.  On small hand-made files (tests/fixtures/glue, always): GLUE's MRPC layouts;
  a malformed row is an error naming the file and line.
* Metrics against numbers computed by hand (Matthews correlation, F1 of class ``1``, Spearman).
* End to end through the real CLIs, for two position encodings of ``roberta_pe_tiny``: a tiny
  sentencepiece model and its fairseq dictionary (``fairseq-preprocess --only-source``, in-process),
  ``fairseq-pe-prepare-glue`` (SST-2 and STS-B, first 160 examples per split),
  ``fairseq-train --task masked_lm`` (2 updates), ``fairseq-train --task sentence_prediction
  --restore-file ...`` with the flags of ``task.json`` (2 updates), then ``fairseq-pe-glue-eval``
  on the reloaded checkpoint: every dev example evaluated once, the metric equal to the one
  fairseq-train printed for the same checkpoint, and :func:`fairseq_pe.bert.glue.evaluate` in-process
  giving the same numbers.
"""

import json
import math
import os
import re
import subprocess

import pytest

from fairseq_pe.bert import glue as glue_eval
from fairseq_pe.data_prep import glue as prep
from fairseq_pe.data_prep.glue import GlueError

from helpers import FIXTURES, PLUGIN, REPO, cli, exit_status, shared_data

LIMIT = 160
TINY = ["--encoder-layers", "2", "--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
        "--encoder-attention-heads", "2"]
COMMON = ["--cpu", "--num-workers", "0", "--optimizer", "adam", "--lr", "1e-4", "--max-update", "2",
          "--batch-size", "8", "--no-epoch-checkpoints", "--no-progress-bar", "--log-interval", "1", "--seed", "1"]


def wc_l(path):
    return int(subprocess.run(["wc", "-l", path], capture_output=True, text=True, check=True).stdout.split()[0])


# ----------------------------------------------------------------------------------------------
# parsing the real files
# ----------------------------------------------------------------------------------------------

# task -> {split: (file, header lines)}
FILES = {
    "SST-2": {"train": ("train.tsv", 1), "valid": ("dev.tsv", 1), "test": ("test-labeled.tsv", 1)},
    "CoLA": {"train": ("train.tsv", 0), "valid": ("dev.tsv", 0)},
    "RTE": {"train": ("train.tsv", 1), "valid": ("dev.tsv", 1), "test": ("test.tsv", 1)},
    "STS-B": {"train": ("original/sts-train.tsv", 0), "valid": ("original/sts-dev.tsv", 0),
              "test": ("original/sts-test.tsv", 0)},
    "WNLI": {"train": ("train.tsv", 1), "valid": ("dev.tsv", 1), "test": ("test.tsv", 1)},
}


@pytest.mark.shared_data
@pytest.mark.parametrize("task", sorted(FILES))
def test_counts_equal_line_counts(task):
    glue_dir = shared_data("glue")
    spec = prep.task_spec(task)
    data, _ = prep.read_task(spec, glue_dir)
    assert sorted(data) == sorted(FILES[task])
    for split, (name, header) in FILES[task].items():
        assert len(data[split]) == wc_l(os.path.join(glue_dir, task, name)) - header, (task, split)
        exs = data[split]
        assert all(e.label is not None for e in exs)
        assert all((e.text1 is not None) == spec.pair for e in exs)
        if not spec.regression:
            assert {e.label for e in exs} == set(spec.labels)
        assert not any(t.endswith("\r") for e in exs for t in (e.text0, e.text1, e.label) if t)


@pytest.mark.shared_data
def test_mrpc_held_out_dev_is_deterministic():
    glue_dir = shared_data("glue")
    spec = prep.task_spec("mrpc")
    data, sources = prep.read_task(spec, glue_dir)
    n_train_file = wc_l(os.path.join(glue_dir, "MRPC", "msr_paraphrase_train.txt")) - 1
    assert len(data["valid"]) == prep.MRPC_DEV_SIZE == 408
    assert len(data["train"]) + len(data["valid"]) == n_train_file == 4076
    assert len(data["test"]) == wc_l(os.path.join(glue_dir, "MRPC", "msr_paraphrase_test.txt")) - 1 == 1725
    train_lines, dev_lines = [e.line for e in data["train"]], [e.line for e in data["valid"]]
    assert not set(train_lines) & set(dev_lines) and dev_lines == sorted(dev_lines)
    assert "RandomState(1)" in sources["valid"]
    again, _ = prep.read_task(spec, glue_dir)
    assert [e.line for e in again["valid"]] == dev_lines
    other, _ = prep.read_task(spec, glue_dir, mrpc_dev_seed=2)
    assert [e.line for e in other["valid"]] != dev_lines
    # the first pair of the file, with its quotes and the BOM-stripped header
    first = (data["train"] + data["valid"])
    first = min(first, key=lambda e: e.line)
    assert first.line == 2 and first.label == "1"
    assert first.text0 == 'Amrozi accused his brother, whom he called "the witness", of deliberately distorting his evidence.'


@pytest.mark.shared_data
def test_quotes_and_licence_columns_kept_intact():
    glue_dir = shared_data("glue")
    spec = prep.task_spec("STS-B")
    exs = prep.parse_file(spec, os.path.join(glue_dir, "STS-B", "original", "sts-train.tsv"), "train")
    by_line = {e.line: e for e in exs}
    # an unbalanced quote: a quote-aware reader would swallow the following lines into this field
    assert by_line[2002].text0 == '"Then the captain was gone.'
    assert by_line[2002].text1 == "Then the captain came back." and by_line[2002].label == "0.8"
    assert by_line[2003].line == 2003  # the next row is its own example
    # rows with two licence fields after sentence2 (9 columns)
    with open(os.path.join(glue_dir, "STS-B", "original", "sts-train.tsv"), encoding="utf-8") as f:
        nine = [i for i, line in enumerate(f, 1) if line.count("\t") == 8]
    assert nine and all(by_line[i].text1 and not by_line[i].text1.startswith("Europe Media") for i in nine)
    # CRLF file: no carriage return left in labels
    sst = prep.parse_file(prep.task_spec("SST-2"), os.path.join(glue_dir, "SST-2", "test-labeled.tsv"), "test")
    assert {e.label for e in sst} == {"0", "1"}


def test_mrpc_glue_layouts(tmp_path):
    """GLUE's dev ids file is used when present; GLUE's train.tsv/dev.tsv are used as they are.  On a
    hand-made msr_paraphrase_train.txt in Microsoft's format (BOM, header, 40 pairs)."""
    with open(os.path.join(FIXTURES, "glue", "MRPC", "msr_paraphrase_train.txt"), encoding="utf-8-sig") as f:
        lines = f.read().split("\n")[:41]  # header + 40 pairs
    assert len(lines) == 41 and lines[0].startswith("Quality\t#1 ID")
    spec = prep.task_spec("MRPC")
    write(tmp_path / "a" / "MRPC" / "msr_paraphrase_train.txt", "\n".join(lines) + "\n")
    ids = [line.split("\t")[1:3] for line in (lines[5], lines[17])]
    write(tmp_path / "a" / "MRPC" / "mrpc_dev_ids.tsv", "".join(f"{a}\t{b}\n" for a, b in ids))
    data, sources = prep.read_task(spec, str(tmp_path / "a"))
    assert [e.line for e in data["valid"]] == [6, 18] and len(data["train"]) == 38 and "test" not in data
    assert "mrpc_dev_ids.tsv" in sources["valid"]
    # GLUE's download script leaves Microsoft's file next to its own train.tsv/dev.tsv
    write(tmp_path / "b" / "MRPC" / "msr_paraphrase_train.txt", "\n".join(lines) + "\n")
    write(tmp_path / "b" / "MRPC" / "train.tsv", "\n".join(lines[:1] + lines[1:31]) + "\n")
    write(tmp_path / "b" / "MRPC" / "dev.tsv", "\n".join(lines[:1] + lines[31:]) + "\n")
    data, sources = prep.read_task(spec, str(tmp_path / "b"))
    assert len(data["train"]) == 30 and len(data["valid"]) == 10 and sources["train"].endswith("train.tsv")
    # an unlabelled test file (GLUE's public test sets) gives inputs without labels
    write(tmp_path / "c" / "RTE" / "test.tsv", "index\tsentence1\tsentence2\n0\tA \"man\t\"A man.\n")
    (test,) = prep.parse_file(prep.task_spec("RTE"), str(tmp_path / "c" / "RTE" / "test.tsv"), "test")
    assert (test.text0, test.text1, test.label) == ('A "man', '"A man.', None)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return str(path)


@pytest.mark.parametrize("body, message", [
    ("sentence\tlabel\na fine film\t1\ntoo\tmany\tfields\n", "train.tsv:3: 3 tab-separated fields"),
    ("sentence\tlabel\na fine film\t1\nbad label\t2\n", "train.tsv:3: label '2' is not one of 0, 1"),
    ("sentence\tlabel\n \t1\n", "train.tsv:2: empty first sentence"),
    ("sentence\tlabel\na fine\rfilm\t1\n", "lines but 3 tab-separated rows"),
    ("sentence\tlabel\na fine film\t1\n\nok\t0\n", "train.tsv:3: empty line"),
    ("text\tlabel\na fine film\t1\n", "train.tsv:1: expected a header naming sentence"),
])
def test_malformed_rows_are_errors_naming_file_and_line(tmp_path, body, message):
    path = write(tmp_path / "SST-2" / "train.tsv", body)
    with pytest.raises(GlueError, match=re.escape(message)):
        prep.parse_file(prep.task_spec("SST-2"), path, "train")


def test_stsb_score_and_layout_errors(tmp_path):
    spec = prep.task_spec("STS-B")
    path = write(tmp_path / "sts.tsv", "g\tf\t2012\t0001\t5.5\tA man.\tA man.\n")
    with pytest.raises(GlueError, match=re.escape("sts.tsv:1: score '5.5' is outside [0, 5]")):
        prep.parse_file(spec, path, "train")
    path = write(tmp_path / "sts2.tsv", "g\tf\t2012\t0001\t5.0\tA man.\n")
    with pytest.raises(GlueError, match=re.escape("sts2.tsv:1: 6 tab-separated fields, expected at least 7")):
        prep.parse_file(spec, path, "train")


def test_cli_rejects_bad_flags(tmp_path, capsys):
    assert exit_status(prep.main, ["--glue-dir", str(tmp_path), "--tasks", "SST-2,QNLI", "--spm-model", "x",
                                   "--dict", "y", "--destdir", str(tmp_path / "d")]) == 2
    assert "--tasks: unknown GLUE task 'QNLI'" in capsys.readouterr().err
    # through the data-prep/ wrapper
    out = cli(os.path.join(REPO, "data-prep", "prepare-glue.sh"), "--glue-dir", str(tmp_path), "--tasks", "SST-2",
              "--spm-model", str(tmp_path / "missing.model"), "--dict", "y", "--destdir", str(tmp_path / "d"),
              check=False)
    assert out.returncode == 2 and f"--spm-model {tmp_path / 'missing.model'}: no such file" in out.stderr


# ----------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------


def test_metrics_against_hand_computed_values():
    # CoLA: TP 3, TN 3, FP 1, FN 1 -> MCC = (3*3 - 1*1) / sqrt(4*4*4*4) = 8/16
    t = ["1", "1", "1", "0", "0", "0", "1", "0"]
    p = ["1", "1", "0", "0", "0", "1", "1", "0"]
    m = glue_eval.glue_metrics("CoLA", t, p)
    assert m == pytest.approx({"mcc": 0.5, "accuracy": 0.75})
    # MRPC: TP 2, FN 2, FP 1, TN 1 -> precision 2/3, recall 1/2, F1 = 4/7 (of class "1", not "0")
    t = ["1", "1", "1", "1", "0", "0"]
    p = ["1", "1", "0", "0", "1", "0"]
    assert glue_eval.glue_metrics("MRPC", t, p) == pytest.approx({"f1": 4 / 7, "accuracy": 0.5})
    # STS-B: rank differences (-1, 1, -1, 1, 0) -> Spearman 1 - 6*4/(5*24) = 0.8; the values are
    # their own ranks, so Pearson is 0.8 too.  A monotone outlier: Spearman 1, Pearson below 1.
    m = glue_eval.glue_metrics("sts-b", [1, 2, 3, 4, 5], [2, 1, 4, 3, 5])
    assert m == pytest.approx({"spearman": 0.8, "pearson": 0.8})
    m = glue_eval.glue_metrics("STS-B", [1, 2, 3, 4, 5], [1, 2, 3, 4, 50])
    assert m["spearman"] == pytest.approx(1.0) and m["pearson"] < 0.8
    assert glue_eval.glue_metrics("RTE", ["entailment", "not_entailment", "entailment"],
                                  ["entailment", "entailment", "entailment"]) == pytest.approx({"accuracy": 2 / 3})
    assert math.isnan(glue_eval.glue_metrics("STS-B", [1, 2, 3], [0.5, 0.5, 0.5])["spearman"])
    with pytest.raises(glue_eval.GlueEvalError, match="unknown GLUE task 'QQP'"):
        glue_eval.glue_metrics("QQP", ["1"], ["1"])


# ----------------------------------------------------------------------------------------------
# end to end
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def glue_bin(tmp_path_factory):
    return prepare_glue(tmp_path_factory)


def prepare_glue(tmp_path_factory):
    """SST-2 and STS-B (first LIMIT examples of each split) prepared with a tiny sentencepiece model."""
    import sentencepiece as spm

    glue_dir = shared_data("glue")
    work = tmp_path_factory.mktemp("glue")
    sst = [e.text0 for e in prep.parse_file(prep.task_spec("SST-2"), os.path.join(glue_dir, "SST-2", "train.tsv"),
                                            "train")[:1500]]
    sts = [t for e in prep.parse_file(prep.task_spec("STS-B"), os.path.join(glue_dir, "STS-B", "original",
                                                                             "sts-train.tsv"), "train")[:600]
           for t in (e.text0, e.text1)]
    with open(work / "text.txt", "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in sst + sts)
    spm.SentencePieceTrainer.train(input=str(work / "text.txt"), model_prefix=str(work / "spm"), vocab_size=300,
                                   character_coverage=1.0, num_threads=1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(work / "spm.model"))
    with open(work / "text.spm", "w", encoding="utf-8") as f:
        f.writelines(" ".join(p) + "\n" for p in sp.encode(sst + sts, out_type=str))
    # the dictionary: fairseq-preprocess --only-source (fairseq's main, in-process: no start-up cost)
    from fairseq import options
    from fairseq_cli import preprocess

    preprocess.main(options.get_preprocessing_parser().parse_args(
        ["--only-source", "--trainpref", str(work / "text.spm"), "--destdir", str(work / "dict"), "--workers", "1"]))
    out = cli("fairseq-pe-prepare-glue", "--glue-dir", glue_dir, "--tasks", "SST-2,STS-B", "--spm-model",
              str(work / "spm.model"), "--dict", str(work / "dict" / "dict.txt"), "--destdir", str(work / "bin"),
              "--limit", str(LIMIT), "--max-positions", "256")
    return work, out.stdout


@pytest.mark.shared_data
def test_prepare_outputs(glue_bin):
    work, stdout = glue_bin
    glue_dir = shared_data("glue")
    assert "SST-2  train 160, valid 160, test 160; 2 classes; metric accuracy" in stdout
    assert "STS-B  train 160, valid 160, test 160; 1 target (regression); metric spearman" in stdout
    assert "valid: 872 examples from" in stdout and "valid: 1,500 examples from" in stdout
    sst, sts = work / "bin" / "SST-2-bin", work / "bin" / "STS-B-bin"
    info = json.loads((sst / "task.json").read_text())
    assert info["num_classes"] == 2 and not info["regression_target"] and info["labels"] == ["0", "1"]
    assert info["splits"] == {"train": LIMIT, "valid": LIMIT, "test": LIMIT}
    assert {"--init-token", "--separator-token"} <= set(info["fairseq_train_args"])
    assert (sst / "label" / "dict.txt").read_text().split("\n")[0].split()[0] == "0"
    assert not (sst / "input1").exists() and (sts / "input1" / "valid.bin").exists()
    info = json.loads((sts / "task.json").read_text())
    assert info["regression_target"] and info["num_classes"] == 1 and info["metric"] == "spearman"
    assert "--regression-target" in info["fairseq_train_args"]
    # STS-B scores / 5 as raw floats; the raw tsv order is kept
    dev = prep.parse_file(prep.task_spec("STS-B"), os.path.join(glue_dir, "STS-B", "original", "sts-dev.tsv"), "valid")
    scores = [float(x) for x in (sts / "label" / "valid.label").read_text().split()]
    assert scores == pytest.approx([float(e.label) / 5 for e in dev[:LIMIT]])
    # no <s> or separator in the binarised data: each sentence is its pieces and </s>
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(str(sts / "input0" / "dict.txt"))
    ds = data_utils.load_indexed_dataset(str(sts / "input1" / "valid"), d)
    sp_lines = (work / "bin" / "STS-B" / "valid.input1").read_text(encoding="utf-8").split("\n")
    assert len(ds) == LIMIT and ds[0].tolist() == [d.index(p) for p in sp_lines[0].split()] + [d.eos()]
    assert dev[0].text1 == (work / "bin" / "STS-B" / "valid.raw.input1").read_text(encoding="utf-8").split("\n")[0]


@pytest.mark.shared_data
def test_long_examples_reported_and_kept(glue_bin, tmp_path, capsys):
    work, _ = glue_bin
    glue_dir = shared_data("glue")
    rc = prep.main(["--glue-dir", glue_dir, "--tasks", "sst-2", "--spm-model", str(work / "spm.model"),
                    "--dict", str(work / "dict" / "dict.txt"), "--destdir", str(tmp_path), "--limit", "30",
                    "--max-positions", "20"])
    out = capsys.readouterr().out
    assert rc == 0
    info = json.loads((tmp_path / "SST-2-bin" / "task.json").read_text())
    assert info["splits"] == {"train": 30, "valid": 30, "test": 30}  # nothing dropped
    n = info["longer_than_max_positions"]["valid"]
    assert n > 0 and info["longest"]["valid"] > 20
    assert f"WARNING: valid: {n} examples longer than --max-positions 20 (kept, not truncated)" in out
    assert "dev.tsv:" in out  # the lines are named
    # a second run replaces the outputs it wrote only with --force (issue 14); a foreign folder is refused
    again = ["--glue-dir", glue_dir, "--tasks", "SST-2", "--spm-model", str(work / "spm.model"),
             "--dict", str(work / "dict" / "dict.txt"), "--destdir", str(tmp_path), "--limit", "5"]
    assert exit_status(prep.main, again) == 2
    assert "SST-2 holds an earlier run's SST-2 data: pass --force" in capsys.readouterr().err
    assert json.loads((tmp_path / "SST-2-bin" / "task.json").read_text())["splits"]["train"] == 30
    assert prep.main(again + ["--force"]) == 0
    assert json.loads((tmp_path / "SST-2-bin" / "task.json").read_text())["splits"]["train"] == 5
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".part")]
    os.makedirs(tmp_path / "other" / "SST-2")
    (tmp_path / "other" / "SST-2" / "mine.txt").write_text("x")
    assert exit_status(prep.main, ["--glue-dir", glue_dir, "--tasks", "SST-2", "--spm-model", str(work / "spm.model"),
                                   "--dict", str(work / "dict" / "dict.txt"), "--destdir", str(tmp_path / "other"),
                                   "--force"]) == 2
    assert "was not written by fairseq-pe-prepare-glue" in capsys.readouterr().err
    assert os.listdir(tmp_path / "other" / "SST-2") == ["mine.txt"]
    # --destdir the GLUE folder itself: DESTDIR/SST-2 is the input
    assert exit_status(prep.main, ["--glue-dir", glue_dir, "--tasks", "SST-2", "--spm-model", str(work / "spm.model"),
                                   "--dict", str(work / "dict" / "dict.txt"), "--destdir", glue_dir, "--force"]) == 2
    assert "would replace the input --glue-dir" in capsys.readouterr().err
    # a dictionary of other symbols than the model's pieces
    bad = write(tmp_path / "bad.txt", "".join(f"word{i} 1\n" for i in range(50)))
    assert exit_status(prep.main, ["--glue-dir", glue_dir, "--tasks", "SST-2", "--spm-model", str(work / "spm.model"),
                                   "--dict", bad, "--destdir", str(tmp_path / "x")]) == 2
    assert "symbols are not pieces of --spm-model" in capsys.readouterr().err


def last_valid_metric(log, name):
    lines = [line for line in log.splitlines() if "valid on 'valid' subset" in line]
    assert lines, log[-3000:]
    return float(re.search(rf"\| {name} (-?[\d.]+)", lines[-1]).group(1))


ENCODINGS = [
    ("ape-learned", ["--pe-absolute", "learned"], "SST-2"),
    ("rpe-learned", ["--pe-absolute", "none", "--pe-relative", "learned"], "STS-B"),
]


@pytest.mark.shared_data
@pytest.mark.parametrize("name, pe, task", ENCODINGS, ids=[e[0] for e in ENCODINGS])
def test_end_to_end(glue_bin, tmp_path, name, pe, task):
    work, _ = glue_bin
    data = str(work / "bin" / f"{task}-bin")
    info = json.loads(open(os.path.join(data, "task.json")).read())
    arch = ["--user-dir", PLUGIN, "--arch", "roberta_pe_tiny", *TINY, *pe]
    cli("fairseq-train", os.path.join(data, "input0"), *arch, "--task", "masked_lm", "--criterion", "masked_lm",
        "--tokens-per-sample", "256", *COMMON, "--save-dir", str(tmp_path / "mlm"))
    train = cli("fairseq-train", data, *arch, *info["fairseq_train_args"], *COMMON,
                "--restore-file", str(tmp_path / "mlm" / "checkpoint_last.pt"), "--save-dir", str(tmp_path / "ft"))
    assert "Loaded checkpoint" in train.stdout + train.stderr
    ckpt = str(tmp_path / "ft" / "checkpoint_last.pt")
    prefix = str(tmp_path / "eval" / "valid")
    out = cli("fairseq-pe-glue-eval", data, "--path", ckpt, "--user-dir", PLUGIN, "--split", "valid", "--out", prefix,
              "--cpu", "--batch-size", "16")
    result = json.loads(open(prefix + ".json").read())
    assert result["task"] == task and result["split"] == "valid"
    assert result["n"] == info["splits"]["valid"] == LIMIT
    assert f"{LIMIT}/{LIMIT} examples" in out.stderr
    with open(prefix + ".predictions.tsv") as f:
        assert len(f.read().splitlines()) == LIMIT + 1
    metrics = result["metrics"]
    fairseq_value = last_valid_metric(train.stdout + train.stderr, info["metric"])
    if task == "SST-2":
        assert set(metrics) == {"accuracy"} and 0.0 <= metrics["accuracy"] <= 1.0
    else:
        assert set(metrics) == {"pearson", "spearman"}
        assert all(v is not None and -1.0 <= v <= 1.0 for v in metrics.values())
    # the reloaded checkpoint gives the number fairseq-train printed (x100, rounded to 0.1)
    assert abs(100 * metrics[info["metric"]] - fairseq_value) <= 0.051, (metrics, fairseq_value)
    again = glue_eval.evaluate(data, ckpt, split="valid", batch_size=7, cpu=True, progress=False)
    assert again["n"] == LIMIT and again["metrics"] == pytest.approx(metrics, abs=1e-5)  # other batches: float noise
    # a checkpoint of the other task, or a masked-LM checkpoint, is refused clearly
    other = str(work / "bin" / ("STS-B-bin" if task == "SST-2" else "SST-2-bin"))
    with pytest.raises(glue_eval.GlueEvalError, match="does not match .*task.json"):
        glue_eval.evaluate(other, ckpt, cpu=True, progress=False)
    with pytest.raises(glue_eval.GlueEvalError, match="trained with --task masked_lm, not sentence_prediction"):
        glue_eval.evaluate(data, str(tmp_path / "mlm" / "checkpoint_last.pt"), cpu=True, progress=False)


def test_eval_never_replaces_results_or_inputs(tmp_path, capsys):
    """Issue 14, before any work: --out files of an earlier run need --force; PREFIX naming DATA_BIN's
    own task.json is refused even with it."""
    data = tmp_path / "SST-2-bin"
    data.mkdir()
    (data / "task.json").write_text('{"task": "SST-2"}')
    (data / "input0").mkdir()
    (data / "input0" / "valid.idx").write_text("")
    (tmp_path / "model.pt").write_text("x")
    (tmp_path / "eval.predictions.tsv").write_text("earlier")
    argv = [str(data), "--path", str(tmp_path / "model.pt")]
    assert exit_status(glue_eval.main, argv + ["--out", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert f"error: --out {tmp_path / 'eval'}: " in err and "eval.predictions.tsv exists already" in err
    assert (tmp_path / "eval.predictions.tsv").read_text() == "earlier"
    assert exit_status(glue_eval.main, argv + ["--out", str(data / "task"), "--force"]) == 2
    assert "would write over the input DATA_BIN" in capsys.readouterr().err
    assert (data / "task.json").read_text() == '{"task": "SST-2"}'
    # --force: the output may go, but this --path is no checkpoint: one clear line, nothing written
    assert exit_status(glue_eval.main, argv + ["--out", str(tmp_path / "eval"), "--force"]) == 2
    assert f"--path {tmp_path / 'model.pt'}: cannot be read as a fairseq checkpoint" in capsys.readouterr().err
    assert (tmp_path / "eval.predictions.tsv").read_text() == "earlier"
