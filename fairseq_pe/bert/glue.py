"""GLUE metrics and ``fairseq-pe-glue-eval``: evaluate a ``sentence_prediction`` checkpoint.

The official metric of each task (computed with scikit-learn / scipy):

=======  ===========================================  ===========
task     metrics (keys of :func:`glue_metrics`)        main
=======  ===========================================  ===========
SST-2    ``accuracy``                                  accuracy
CoLA     ``mcc`` (Matthews correlation), ``accuracy``  mcc
MRPC     ``f1`` (positive class ``1``), ``accuracy``   f1
RTE      ``accuracy``                                  accuracy
STS-B    ``pearson``, ``spearman``                     spearman
WNLI     ``accuracy``                                  accuracy
=======  ===========================================  ===========

Values are fractions in [0, 1] (correlations in [-1, 1]), not percentages.  A correlation that is
undefined (constant predictions) is ``nan`` here and ``null`` in the JSON file.

Usage::

    fairseq-pe-glue-eval DATA_BIN --path CKPT [--user-dir fairseq_pe] [--split valid]
        [--out PREFIX] [--batch-size 32] [--glue-task NAME] [--cpu]

``DATA_BIN`` is a ``TASK-bin`` folder of ``fairseq-pe-prepare-glue`` (its ``task.json`` names the
GLUE task; without one, pass ``--glue-task``).  The checkpoint is loaded with fairseq's
``checkpoint_utils.load_model_ensemble_and_task`` and the split with the task's own
``load_dataset``, so the inputs are exactly those of fine-tuning (``--init-token``,
``--separator-token``, ``--max-positions`` of the checkpoint).  Every example is evaluated once,
in batches, through ``model(src_tokens, features_only=True, classification_head_name=HEAD)`` (the
checkpoint's ``--classification-head-name``); an example longer than the model's positions is an
error, not skipped.  ``--out PREFIX`` writes ``PREFIX.json`` (metrics, counts, paths) and
``PREFIX.predictions.tsv`` (``id``, ``prediction``, ``target``; ids are the 0-based example
numbers of the split; STS-B on the 0-5 scale).  A split without labels (a public GLUE test set)
gets predictions and no metrics.  Both files are written atomically (the JSON last); those of an
earlier run are replaced only with ``--force``, and never an input (``--path``, ``DATA_BIN``'s files).
"""

import argparse
import json
import math
import os
import sys
import time
import warnings
from typing import Dict, List, Optional, Sequence

import numpy as np

from fairseq_pe.errors import UserError, cli
from fairseq_pe.outputs import atomic_open, check_new_files, write_json
from fairseq_pe.safe_load import CheckpointRefused

DEFAULT_HEAD = "sentence_classification_head"

TASK_METRICS = {
    "SST-2": ("accuracy", ("accuracy",)),
    "CoLA": ("mcc", ("mcc", "accuracy")),
    "MRPC": ("f1", ("f1", "accuracy")),
    "RTE": ("accuracy", ("accuracy",)),
    "STS-B": ("spearman", ("spearman", "pearson")),
    "WNLI": ("accuracy", ("accuracy",)),
}


class GlueEvalError(UserError):
    """Bad input: the message names the flag or file."""


def canonical_task(name: str) -> str:
    for k in TASK_METRICS:
        if k.lower() == str(name).strip().lower():
            return k
    raise GlueEvalError(f"unknown GLUE task {name!r}: expected one of {', '.join(TASK_METRICS)}")


# ----------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------


def accuracy(y_true: Sequence, y_pred: Sequence) -> float:
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(list(y_true), list(y_pred)))


def f1(y_true: Sequence, y_pred: Sequence, positive="1") -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(list(y_true), list(y_pred), pos_label=positive, average="binary", zero_division=0.0))


def mcc(y_true: Sequence, y_pred: Sequence) -> float:
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(list(y_true), list(y_pred)))


def _constant(x) -> bool:
    x = np.asarray(x, dtype=np.float64)
    return bool(len(x) == 0 or np.all(x == x[0]))


def pearson(y_true: Sequence[float], y_pred: Sequence[float]) -> float:
    from scipy.stats import pearsonr

    if len(y_true) < 2 or _constant(y_true) or _constant(y_pred):
        return float("nan")
    return float(pearsonr(np.asarray(y_pred, np.float64), np.asarray(y_true, np.float64))[0])


def spearman(y_true: Sequence[float], y_pred: Sequence[float]) -> float:
    from scipy.stats import spearmanr

    if len(y_true) < 2 or _constant(y_true) or _constant(y_pred):
        return float("nan")
    return float(spearmanr(np.asarray(y_pred, np.float64), np.asarray(y_true, np.float64))[0])


def glue_metrics(task: str, y_true: Sequence, y_pred: Sequence) -> Dict[str, float]:
    """The metrics of ``task`` (see the module docstring).

    Classification: ``y_true``/``y_pred`` are label strings as in the GLUE files (``"0"``/``"1"``,
    ``"entailment"``/``"not_entailment"``); STS-B: numbers.
    """
    task = canonical_task(task)
    if len(y_true) != len(y_pred):
        raise ValueError(f"{len(y_true)} targets but {len(y_pred)} predictions")
    if len(y_true) == 0:
        raise ValueError("no examples")
    out = {}
    for name in TASK_METRICS[task][1]:
        if name == "accuracy":
            out[name] = accuracy(y_true, y_pred)
        elif name == "f1":
            out[name] = f1(y_true, y_pred, positive="1")
        elif name == "mcc":
            out[name] = mcc(y_true, y_pred)
        elif name == "pearson":
            out[name] = pearson(y_true, y_pred)
        elif name == "spearman":
            out[name] = spearman(y_true, y_pred)
    return out


# ----------------------------------------------------------------------------------------------
# evaluation of a checkpoint
# ----------------------------------------------------------------------------------------------


def _read_task_json(data_bin: str) -> Optional[dict]:
    path = os.path.join(data_bin, "task.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError) as e:
        raise GlueEvalError(f"{path}: unreadable ({e}); prepare DATA_BIN again with fairseq-pe-prepare-glue") from None
    if not isinstance(info, dict) or "task" not in info:
        raise GlueEvalError(f"{path}: not a task.json of fairseq-pe-prepare-glue (no \"task\")")
    return info


def _cfg_get(cfg, section: str, key: str, default=None):
    sec = cfg.get(section) if hasattr(cfg, "get") else getattr(cfg, section, None)
    if sec is None:
        return default
    try:
        value = sec.get(key, default) if hasattr(sec, "get") else getattr(sec, key, default)
    except Exception:  # an unresolvable interpolation
        return default
    return default if value is None else value


def evaluate(data_bin: str, checkpoint: str, split: str = "valid", batch_size: int = 32,
             glue_task: Optional[str] = None, user_dir: Optional[str] = None, cpu: bool = False,
             progress: bool = True, out_prefix: Optional[str] = None) -> dict:
    """Evaluate ``checkpoint`` on ``split`` of ``data_bin``; returns the result dict.

    Keys: ``task``, ``split``, ``n`` (examples evaluated = the split size), ``metrics``
    ({name: value}; empty for an unlabelled split), ``main_metric``, ``checkpoint``, ``data``,
    ``classification_head``, ``predictions`` (by id) and ``targets`` (by id, or None).
    """
    import torch

    import fairseq_pe  # noqa: F401  (registers the models, loads checkpoints on current torch)
    from fairseq import checkpoint_utils, utils

    if not os.path.isdir(data_bin):
        raise GlueEvalError(f"DATA_BIN {data_bin}: no such folder")
    if not os.path.isfile(checkpoint):
        raise GlueEvalError(f"--path {checkpoint}: no such file")
    if batch_size < 1:
        raise GlueEvalError("--batch-size must be >= 1")
    info = _read_task_json(data_bin)
    if glue_task is not None:
        task_name = canonical_task(glue_task)
        if info is not None and canonical_task(info["task"]) != task_name:
            raise GlueEvalError(f"--glue-task {glue_task} contradicts {data_bin}/task.json ({info['task']})")
    elif info is not None:
        task_name = canonical_task(info["task"])
    else:
        raise GlueEvalError(f"{data_bin} has no task.json (not written by fairseq-pe-prepare-glue): pass --glue-task")
    if not os.path.isfile(os.path.join(data_bin, "input0", f"{split}.idx")):
        have = sorted(f[:-4] for f in os.listdir(os.path.join(data_bin, "input0"))
                      if f.endswith(".idx")) if os.path.isdir(os.path.join(data_bin, "input0")) else []
        raise GlueEvalError(f"--split {split}: no {data_bin}/input0/{split}.idx (splits there: {', '.join(have) or 'none'})")
    if user_dir:
        if not os.path.isdir(user_dir):
            raise GlueEvalError(f"--user-dir {user_dir}: no such folder")
        utils.import_user_module(argparse.Namespace(user_dir=user_dir))

    overrides = {"data": data_bin}
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint, overrides)
    except CheckpointRefused:  # it would run code as it loads: its message names what, and how to trust it
        raise
    except Exception as e:  # noqa: BLE001  (a truncated file, not a torch pickle, ...)
        raise GlueEvalError(f"--path {checkpoint}: cannot be read as a fairseq checkpoint "
                            f"({type(e).__name__}: {str(e)[:300]})") from None
    saved = state.get("cfg")
    task_type = _cfg_get(saved, "task", "_name") if saved is not None else \
        getattr(state.get("args"), "task", None)
    if task_type != "sentence_prediction":
        raise GlueEvalError(f"--path {checkpoint} was trained with --task {task_type}, not sentence_prediction")
    if saved is not None and info is not None:
        saved_regression = bool(_cfg_get(saved, "criterion", "regression_target", False))
        saved_classes = _cfg_get(saved, "task", "num_classes")
        if saved_regression != bool(info["regression_target"]) or \
                (saved_classes is not None and int(saved_classes) != int(info["num_classes"])):
            raise GlueEvalError(f"--path {checkpoint} (num_classes {saved_classes}, regression {saved_regression}) "
                                f"does not match {data_bin}/task.json ({info['task']}: num_classes "
                                f"{info['num_classes']}, regression {info['regression_target']})")
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides=overrides,
                                                                          state=state)
    except FileNotFoundError as e:
        raise GlueEvalError(f"--path {checkpoint} / {data_bin}: {e}") from None
    model = models[0]
    regression = bool(task.cfg.regression_target)
    num_classes = int(task.cfg.num_classes)
    if info is not None and (bool(info["regression_target"]) != regression or int(info["num_classes"]) != num_classes):
        raise GlueEvalError(f"--path {checkpoint} (num_classes {num_classes}, regression {regression}) does not match "
                            f"{data_bin}/task.json (num_classes {info['num_classes']}, regression {info['regression_target']})")
    if (task_name == "STS-B") != regression:
        raise GlueEvalError(f"{task_name} is {'a regression' if task_name == 'STS-B' else 'a classification'} task "
                            f"but the checkpoint was trained {'with' if regression else 'without'} --regression-target")
    head = _cfg_get(cfg, "criterion", "classification_head_name") or \
        _cfg_get(cfg, "task", "classification_head_name") or DEFAULT_HEAD
    heads = getattr(model, "classification_heads", {})
    if head not in heads:
        raise GlueEvalError(f"--path {checkpoint}: no classification head {head!r} (heads: {', '.join(heads) or 'none'})")
    label_scale = float(info["label_scale"]) if info is not None and info.get("label_scale") else 1.0

    use_cuda = torch.cuda.is_available() and not cpu
    model.eval()
    if use_cuda:
        model.cuda()
    task.load_dataset(split)
    dataset = task.dataset(split)
    n_total = len(dataset)
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    too_long = [i for i in range(n_total) if dataset.size(i) > max_positions]
    if too_long:
        raise GlueEvalError(f"{data_bin} {split}: {len(too_long)} examples are longer than the model's "
                            f"{max_positions} positions (e.g. example {too_long[0]}: {dataset.size(too_long[0])} tokens); "
                            "they are not skipped")
    itr = task.get_batch_iterator(
        dataset=dataset, max_sentences=batch_size, max_positions=max_positions, ignore_invalid_inputs=False,
        required_batch_size_multiple=1, seed=1, num_workers=0, data_buffer_size=0,
    )
    with warnings.catch_warnings():  # fairseq's loader asks for pinned memory, useless on a CPU
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        itr = itr.next_epoch_itr(shuffle=False)
    n_batches = len(itr)
    ids: List[int] = []
    preds: List = []
    targets: List = []
    labelled = None
    ld = task.label_dictionary
    t0 = time.time()
    last = t0
    with torch.no_grad():
        for b, sample in enumerate(itr, 1):
            if use_cuda:
                sample = utils.move_to_cuda(sample)
            if labelled is None:
                labelled = "target" in sample
            logits, _ = model(sample["net_input"]["src_tokens"], features_only=True, classification_head_name=head)
            ids += sample["id"].tolist()
            if regression:
                preds += (logits.view(-1).float().cpu() * label_scale).tolist()
                if labelled:
                    targets += (sample["target"].view(-1).float().cpu() * label_scale).tolist()
            else:
                preds += [ld[i + ld.nspecial] for i in logits.argmax(dim=-1).cpu().tolist()]
                if labelled:
                    targets += [ld[i + ld.nspecial] for i in sample["target"].view(-1).cpu().tolist()]
            if progress and (time.time() - last > 10 or b == n_batches):
                last = time.time()
                print(f"glue-eval: {len(ids):,}/{n_total:,} examples ({b}/{n_batches} batches, "
                      f"{last - t0:.1f}s)", file=sys.stderr, flush=True)
    if len(ids) != n_total or len(set(ids)) != n_total:
        raise AssertionError(f"evaluated {len(ids)} examples ({len(set(ids))} distinct) but {split} has {n_total}")
    order = np.argsort(ids, kind="stable")
    preds = [preds[i] for i in order]
    targets = [targets[i] for i in order] if labelled else None
    metrics = glue_metrics(task_name, targets, preds) if labelled else {}
    main_metric = TASK_METRICS[task_name][0]
    if info is not None and "splits" in info and split in info["splits"] and info["splits"][split] != n_total:
        raise AssertionError(f"{split}: {n_total} examples loaded but task.json says {info['splits'][split]}")
    result = {
        "task": task_name,
        "split": split,
        "n": n_total,
        "metrics": metrics,
        "main_metric": main_metric,
        "checkpoint": os.path.abspath(checkpoint),
        "data": os.path.abspath(data_bin),
        "classification_head": head,
        "predictions": preds,
        "targets": targets,
    }
    if out_prefix:
        write_result(result, out_prefix)
    return result


def _json_number(v):
    return None if isinstance(v, float) and math.isnan(v) else v


def output_files(prefix: str) -> List[str]:
    """The files of ``--out PREFIX``."""
    return [prefix + ".json", prefix + ".predictions.tsv"]


def write_result(result: dict, prefix: str):
    """``PREFIX.predictions.tsv`` then ``PREFIX.json`` (the summary, last: it says the run is
    complete), each written atomically."""
    summary = {k: v for k, v in result.items() if k not in ("predictions", "targets")}
    summary["metrics"] = {k: _json_number(v) for k, v in result["metrics"].items()}
    summary["predictions_file"] = os.path.abspath(prefix + ".predictions.tsv")
    with atomic_open(prefix + ".predictions.tsv", newline="\n") as f:
        f.write("id\tprediction\ttarget\n")
        targets = result["targets"] or [""] * len(result["predictions"])
        fmt = lambda v: f"{v:.6g}" if isinstance(v, float) else str(v)  # noqa: E731
        for i, (p, t) in enumerate(zip(result["predictions"], targets)):
            f.write(f"{i}\t{fmt(p)}\t{fmt(t)}\n")
    write_json(prefix + ".json", summary)


def format_metrics(result: dict) -> str:
    if not result["metrics"]:
        return f"{result['task']} {result['split']}: {result['n']:,} examples, unlabelled (no metrics)"
    parts = []
    for k, v in result["metrics"].items():
        parts.append(f"{k} {'undefined (constant predictions or targets)' if math.isnan(v) else f'{v:.4f}'}")
    return f"{result['task']} {result['split']} (n={result['n']:,}): " + ", ".join(parts) + \
        f"  [main: {result['main_metric']}]"


@cli
def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="fairseq-pe-glue-eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_bin", metavar="DATA_BIN", help="a TASK-bin folder of fairseq-pe-prepare-glue")
    p.add_argument("--path", required=True, help="the fine-tuned sentence_prediction checkpoint")
    p.add_argument("--user-dir", default=None, help="fairseq plugin folder (e.g. fairseq_pe)")
    p.add_argument("--split", default="valid", help="valid (default), test or train")
    p.add_argument("--out", default=None, metavar="PREFIX", help="write PREFIX.json and PREFIX.predictions.tsv")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--glue-task", default=None, help="the GLUE task, when DATA_BIN has no task.json")
    p.add_argument("--cpu", action="store_true", help="do not use a GPU")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--force", action="store_true", help="replace the --out files of an earlier run")
    args = p.parse_args(argv)
    if args.out:  # before any work (GlueEvalError and UserError end as "PROG: error: ...", status 2)
        inputs = [("--path", args.path)]
        if os.path.isdir(args.data_bin):
            inputs += [("DATA_BIN", os.path.join(root, name)) for root, _, names in os.walk(args.data_bin)
                       for name in names]
        check_new_files(output_files(args.out), args.force, flag="--out", inputs=inputs, where=args.out)
    result = evaluate(args.data_bin, args.path, split=args.split, batch_size=args.batch_size,
                      glue_task=args.glue_task, user_dir=args.user_dir, cpu=args.cpu,
                      progress=not args.quiet, out_prefix=args.out)
    print(format_metrics(result), flush=True)
    if args.out:
        print(f"wrote {args.out}.json and {args.out}.predictions.tsv", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
