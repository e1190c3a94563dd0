"""``fairseq-pe-average-checkpoints``: the parameters of several checkpoints averaged into one, fairseq's last step of
WMT training (the papers' BLEU is that of the average of the last checkpoints).

    fairseq-pe-average-checkpoints --inputs checkpoints/ --num-update-checkpoints 5 --output checkpoint.avg5.pt
    fairseq-pe-average-checkpoints --inputs checkpoints/ --num-epoch-checkpoints 10 --output checkpoint.avg10.pt
    fairseq-pe-average-checkpoints --inputs a.pt b.pt c.pt --output avg.pt

The options are those of fairseq's ``scripts/average_checkpoints.py``, which pip's fairseq does not install and which
calls ``torch.load`` as torch < 2.6 did (torch now refuses fairseq checkpoints there):

* ``--inputs``: the checkpoint files, or with ``--num-update-checkpoints N`` / ``--num-epoch-checkpoints N`` one
  folder, of which the N last ``checkpoint_E_U.pt`` (by update U) or ``checkpoint E.pt`` (by epoch E) are averaged;
  ``--checkpoint-upper-bound K`` ignores those past update (or epoch) K.  Fewer than N found is an error.
* Every floating-point tensor of the checkpoints' ``model`` is averaged (summed in float64, then cast back to its
  dtype: fp16 checkpoints stay fp16), integer ones are averaged with floor division, as fairseq's script does; the
  checkpoints must hold the same parameters with the same shapes.  Everything else (configuration, dictionaries'
  settings, the training state) is that of the newest input, the first of ``--inputs`` as given, or the last
  by number with ``--num-*-checkpoints``.
* The output is written atomically and never replaces an existing file without ``--force``, nor an input.

Checkpoints are loaded with fairseq's loader, as ``fairseq-generate`` loads them (:mod:`fairseq_pe.compat`).  Any
fairseq model averages, the plugin's and stock's; the averaged checkpoint loads with ``fairseq-generate``.
"""

import argparse
import os
import re
from typing import List, Optional

from fairseq_pe.errors import UserError, cli

PATTERNS = {"update": re.compile(r"^checkpoint_\d+_(\d+)\.pt$"), "epoch": re.compile(r"^checkpoint(\d+)\.pt$")}


def last_checkpoints(folder: str, count: int, by: str, upper_bound: Optional[int] = None) -> List[str]:
    """The ``count`` last checkpoints of ``folder`` by update or epoch number (newest first), as fairseq's script
    picks them; an error names the flag when there are fewer."""
    if not os.path.isdir(folder):
        raise UserError(f"--inputs {folder}: with --num-{by}-checkpoints, give one folder of checkpoints")
    found = []
    for name in os.listdir(folder):
        m = PATTERNS[by].match(name)
        if m and (upper_bound is None or int(m.group(1)) <= upper_bound):
            found.append((int(m.group(1)), os.path.join(folder, name)))
    found.sort(reverse=True)
    if len(found) < count:
        kind = "checkpoint_EPOCH_UPDATE.pt" if by == "update" else "checkpointEPOCH.pt"
        bound = "" if upper_bound is None else f" up to {by} {upper_bound} (--checkpoint-upper-bound)"
        raise UserError(f"--num-{by}-checkpoints {count}: {folder} has {len(found)} {kind} files{bound}")
    return [path for _, path in found[:count]]


def average(paths: List[str]):
    """The first checkpoint's state with its model's tensors replaced by their average over ``paths``."""
    from fairseq import checkpoint_utils

    import fairseq_pe  # noqa: F401  (fairseq's loader, with the plugin's fixes: trusted, missing files by name)

    newest, sums = None, {}
    for path in paths:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
        model = state.get("model") if isinstance(state, dict) else None
        if not isinstance(model, dict) or not model:
            raise UserError(f"--inputs {path}: not a fairseq checkpoint (no 'model' parameters)")
        if newest is None:
            newest, reference = state, {k: (tuple(v.shape), v.dtype) for k, v in model.items()}
        shapes = {k: (tuple(v.shape), v.dtype) for k, v in model.items()}
        if shapes.keys() != reference.keys():
            differ = sorted(shapes.keys() ^ reference.keys())
            raise UserError(f"--inputs {path}: not the parameters of {paths[0]} ({len(differ)} differ, e.g. "
                            f"{differ[0]}): average checkpoints of one training")
        mismatched = [k for k in shapes if shapes[k] != reference[k]]
        if mismatched:
            k = mismatched[0]
            raise UserError(f"--inputs {path}: {k} is {shapes[k]}, in {paths[0]} {reference[k]}")
        for key, tensor in model.items():
            value = tensor.double() if tensor.is_floating_point() else tensor.long()
            sums[key] = value.clone() if key not in sums else sums[key].add_(value)
    averaged = {}
    for key, (_, dtype) in reference.items():
        total = sums[key]
        averaged[key] = (total / len(paths) if total.is_floating_point() else total // len(paths)).to(dtype)
    newest["model"] = averaged
    return newest


@cli
def main(argv=None):
    p = argparse.ArgumentParser(prog="fairseq-pe-average-checkpoints", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True,
                   help="checkpoint files, or one folder with --num-update-checkpoints/--num-epoch-checkpoints")
    p.add_argument("--output", required=True, help="the averaged checkpoint (new, unless --force)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--num-update-checkpoints", type=int, metavar="N",
                       help="average the N last checkpoint_EPOCH_UPDATE.pt of the folder (by update)")
    which.add_argument("--num-epoch-checkpoints", type=int, metavar="N",
                       help="average the N last checkpointEPOCH.pt of the folder (by epoch)")
    p.add_argument("--checkpoint-upper-bound", type=int, metavar="K",
                   help="with --num-*-checkpoints: ignore checkpoints past update (or epoch) K")
    p.add_argument("--force", action="store_true", help="replace --output if it exists")
    args = p.parse_args(argv)
    count = args.num_update_checkpoints or args.num_epoch_checkpoints
    by = "update" if args.num_update_checkpoints else "epoch"
    if count is not None:
        if count < 1:
            raise UserError(f"--num-{by}-checkpoints must be at least 1, got {count}")
        if len(args.inputs) != 1:
            raise UserError(f"--num-{by}-checkpoints: --inputs takes one folder, got {len(args.inputs)} paths")
        paths = last_checkpoints(args.inputs[0], count, by, args.checkpoint_upper_bound)
    else:
        if args.checkpoint_upper_bound is not None:
            raise UserError("--checkpoint-upper-bound needs --num-update-checkpoints or --num-epoch-checkpoints")
        paths = list(args.inputs)
        for path in paths:
            if not os.path.isfile(path):
                raise UserError(f"--inputs {path}: no such checkpoint file")
        if len(set(map(os.path.realpath, paths))) < len(paths):
            raise UserError("--inputs: a checkpoint is given twice (it would count twice in the average)")
    from fairseq_pe.outputs import check_new_file, save_torch

    check_new_file(args.output, args.force, flag="--output", inputs=[("--inputs", path) for path in paths])
    print(f"averaging {len(paths)} checkpoints: {', '.join(paths)}", flush=True)
    save_torch(average(paths), args.output)
    print(f"wrote {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    main()
