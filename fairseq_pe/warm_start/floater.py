"""Convert a Transformer checkpoint into a FLOATER checkpoint (Liu et al. 2020, §3.3 and §4.4).

    python scripts/warm_start_floater.py checkpoints/checkpoint_best.pt floater_init.pt
    fairseq-train DATA --user-dir fairseq_pe --arch transformer_pe_wmt_en_de ... \\
        --restore-file floater_init.pt --reset-optimizer ...

Input: a checkpoint of fairseq's stock ``transformer`` (any of its architectures, sinusoidal
or ``--encoder-learned-pos`` positions) or of ``transformer_pe`` (any encoding).  Output: a
``transformer_pe`` checkpoint with ``--pe-floater-bias``:

* every Transformer weight is copied; the input encoding is kept: stock sinusoids become
  ``--pe-absolute sinusoidal-fairseq`` (fairseq's own formula and offset, the same vectors),
  stock learned tables ``--pe-absolute learned`` (the same rows);
* FLOATER's Q/K/V-bias dynamics are added with zero initial values and h ≡ 0 (the last
  layer of h is zero, the first keeps its random initialisation so that gradients reach all
  of θ from the second update on), so every bias is zero (Eq. 13) and the converted model
  computes exactly what the original did.  The script checks this on a random batch and
  refuses to write a checkpoint whose outputs differ by more than ``--tolerance``;
* the optimizer state is dropped (the parameters changed); the training-iterator state and
  the ``--pe-floater-*`` options given here are kept.

OUTPUT is never CHECKPOINT itself, and an existing OUTPUT is replaced only with ``--force``; it is
written atomically (a temporary file in its folder, renamed when complete), so an interrupted run
leaves no half checkpoint.

Any ``--pe-floater-*`` option (``--pe-floater-dt``, ``--pe-floater-lr-scale``,
``--pe-floater-freeze-body`` ...) can be given and is stored in the checkpoint; the
fine-tuning command line may override them.
"""

import argparse
import copy
import logging
import os

import torch

from fairseq import checkpoint_utils
from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_pe  # noqa: F401  (registers transformer_pe)
from fairseq_pe import safe_load
from fairseq_pe.errors import UserError, cli
from fairseq_pe.models.transformer_pe import TransformerPEModel
from fairseq_pe.outputs import check_new_file, save_torch
from fairseq_pe.positional.floater import add_floater_args
from fairseq_pe.positional.sinusoid_scale import SCALE_KEY

logger = logging.getLogger("fairseq_pe.warm_start.floater")


class WarmStartError(UserError):
    """A checkpoint or option the conversion cannot take; the message says which."""


def check_paths(args):
    """Before any work: the input is there, the output is new (or ``--force``) and not the input."""
    if not os.path.isfile(args.checkpoint):
        raise WarmStartError(f"CHECKPOINT {args.checkpoint}: no such file")
    check_new_file(args.output, getattr(args, "force", False), flag="OUTPUT",
                   inputs=[("CHECKPOINT", args.checkpoint)])
    if getattr(args, "data", None) and not os.path.isdir(args.data):
        raise WarmStartError(f"--data {args.data}: no such folder")
    if getattr(args, "user_dir", None) and not os.path.isdir(args.user_dir):
        raise WarmStartError(f"--user-dir {args.user_dir}: no such folder")


def read_checkpoint(path: str) -> dict:
    """The checkpoint's state dict, loaded without running code (:mod:`fairseq_pe.safe_load`: refused by name where
    it needs more); an unreadable file is a :class:`WarmStartError` naming it."""
    try:
        state = safe_load.load(path, what=f"CHECKPOINT {path}")
    except safe_load.CheckpointRefused:
        raise
    except Exception as e:  # noqa: BLE001  (a truncated file, not a torch pickle, ...)
        raise WarmStartError(f"CHECKPOINT {path}: cannot be read as a fairseq checkpoint "
                             f"({type(e).__name__}: {str(e)[:300]})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise WarmStartError(f"CHECKPOINT {path}: not a fairseq checkpoint (no model weights)")
    return state


def load_original(path: str, data):
    """fairseq's own loading of the checkpoint with its task (the dictionaries of ``--data``)."""
    overrides = {"data": data} if data else None
    try:
        return checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
    except FileNotFoundError as e:  # the data folder it was trained on is gone
        raise WarmStartError(f"cannot set up the task of CHECKPOINT {path}: {e}; pass --data DIR, the folder "
                             "with its dictionaries") from None


def _model_args(state):
    if state.get("cfg") is not None and state["cfg"].get("model") is not None:
        return state["cfg"]["model"]
    if state.get("args") is not None:
        return state["args"]
    raise WarmStartError("the checkpoint has neither cfg.model nor args: not a fairseq checkpoint")


def registered_model_class(model_args, base, stock: str, ours: str, described: str, hint: str = ""):
    """The model class that fairseq's registry gives a checkpoint's ``--arch``, if it is a ``base``.

    The errors name fairseq's ``stock`` model and the plugin's ``ours`` (``transformer``,
    ``transformer_pe``), ``described`` in words, and end with ``hint``."""
    if not isinstance(model_args, argparse.Namespace):
        raise WarmStartError(f"this checkpoint's model configuration is not {described}'s (argparse) one")
    arch = getattr(model_args, "arch", None) or getattr(model_args, "_name", None)
    cls = ARCH_MODEL_REGISTRY.get(arch)
    if cls is None or not issubclass(cls, base):
        raise WarmStartError(f"--arch {arch}: only fairseq's {stock} and fairseq_pe's {ours} checkpoints can be "
                             f"converted{hint}")
    return cls


def converted_args(model_args, floater_options: dict):
    """The ``transformer_pe`` + ``--pe-floater-bias`` arguments for a checkpoint's model arguments."""
    from fairseq.models.transformer import TransformerModel

    cls = registered_model_class(model_args, TransformerModel, "transformer", "transformer_pe",
                                 "a fairseq Transformer")
    args = copy.deepcopy(model_args)
    if issubclass(cls, TransformerPEModel):
        if getattr(args, "pe_floater_bias", False) or getattr(args, "pe_absolute", None) == "floater":
            raise WarmStartError("this checkpoint is a FLOATER model already")
    else:  # fairseq's stock transformer: keep its input encoding, expressed as a --pe-absolute
        if getattr(args, "no_token_positional_embeddings", False):
            args.pe_absolute = "none"
        elif getattr(args, "encoder_learned_pos", False) or getattr(args, "decoder_learned_pos", False):
            if not (getattr(args, "encoder_learned_pos", False) and getattr(args, "decoder_learned_pos", False)):
                raise WarmStartError("learned positions on one side only cannot be expressed with one --pe-absolute")
            args.pe_absolute = "learned"
        else:
            args.pe_absolute = "sinusoidal-fairseq"
        args.encoder_learned_pos = args.decoder_learned_pos = False
        args.no_token_positional_embeddings = False
        args.pe_relative = "none"
    args.arch = "transformer_pe"
    args._name = "transformer_pe"
    args.pe_floater_bias = True
    for name, value in floater_options.items():
        setattr(args, name, value)
    return args


def convert_state_dict(old_state: dict, new_model, padding_idx: int, stock: bool) -> dict:
    """The original weights under the new model's names."""
    mapped = {}
    for key, value in old_state.items():
        if key.endswith("embed_positions._float_tensor"):
            continue  # fairseq's sinusoidal module's dtype probe
        if stock and key.endswith("embed_positions.weight"):  # stock learned table: offset padding_idx + 1
            key = key.replace("embed_positions.weight", "embed_positions.absolute.weight")
            value = value[padding_idx + 1:].unsqueeze(0)
        mapped[key] = value
    new_keys = set(new_model.state_dict())
    unexpected = sorted(set(mapped) - new_keys)
    if unexpected:
        raise WarmStartError(f"weights of the checkpoint have no place in the FLOATER model: {unexpected[:8]}")
    floater = {id(p) for p in new_model.floater.floater_parameters()}
    names = {id(p): n for n, p in new_model.named_parameters()}
    allowed_missing = {names[i] for i in floater if i in names}
    allowed_missing |= {"floater." + n for n, _ in new_model.floater.named_buffers()}  # its bound's record
    missing = sorted(new_keys - set(mapped) - allowed_missing)
    # a stock checkpoint's sinusoids have no scale: loading gives them S = 1 (sinusoid_scale), as they were
    missing = [k for k in missing if not k.endswith(("_dtype_probe", "omega", SCALE_KEY))]
    if missing:
        raise WarmStartError(f"the FLOATER model has weights the checkpoint lacks: {missing[:8]}")
    return mapped


def save_converted(state: dict, model, new_args, path: str):
    """Write ``state`` (a fairseq checkpoint) with ``model``'s weights and ``new_args`` as its model
    configuration; the optimizer state is dropped (the parameters changed)."""
    out = dict(state)
    out["model"] = model.state_dict()
    if out.get("cfg") is not None and out["cfg"].get("model") is not None:
        out["cfg"] = copy.copy(out["cfg"])
        out["cfg"]["model"] = new_args
    else:
        out["args"] = new_args
    out.pop("last_optimizer_state", None)
    save_torch(out, path)  # atomically: an interrupted write leaves no half checkpoint


def max_output_difference(original, converted, dictionary, seed: int = 0) -> float:
    """Largest |log-prob difference| of the two models on a random, left-padded batch."""
    g = torch.Generator().manual_seed(seed)
    n = len(dictionary)
    src = torch.randint(dictionary.nspecial, n, (4, 23), generator=g)
    src[1, :5] = dictionary.pad()
    src[3, :17] = dictionary.pad()
    src[:, -1] = dictionary.eos()
    lengths = src.ne(dictionary.pad()).sum(1)
    prev = torch.randint(dictionary.nspecial, n, (4, 19), generator=g)
    prev[:, 0] = dictionary.eos()
    outs = []
    for model in (original, converted):
        model.eval()
        with torch.no_grad():
            net = model(src, lengths, prev)
            outs.append(model.get_normalized_probs(net, log_probs=True))
    return float((outs[0] - outs[1]).abs().max())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                argument_default=argparse.SUPPRESS)
    p.add_argument("checkpoint", help="fairseq transformer or transformer_pe checkpoint")
    p.add_argument("output", help="where to write the FLOATER checkpoint")
    p.add_argument("--data", help="data directory with the dictionaries (default: the one the checkpoint was "
                                  "trained on)")
    p.add_argument("--user-dir", help="a further fairseq plugin the checkpoint needs")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest allowed log-probability difference between original and converted model")
    p.add_argument("--seed", type=int, default=1, help="seed of FLOATER's dynamics initialisation")
    p.add_argument("--force", action="store_true", default=False,
                   help="replace OUTPUT if it exists (it is never allowed to be CHECKPOINT itself)")
    add_floater_args(p.add_argument_group("FLOATER options stored in the checkpoint"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if hasattr(args, "pe_floater_bias"):
        del args.pe_floater_bias  # always on
    if getattr(args, "pe_floater_dynamics", "ode") != "ode":
        raise WarmStartError("--pe-floater-dynamics: the warm start needs the ODE (h ≡ 0 is what makes it exact)")
    check_paths(args)
    if getattr(args, "user_dir", None):
        from fairseq import utils

        utils.import_user_module(argparse.Namespace(user_dir=args.user_dir))
    floater_options = {k: v for k, v in vars(args).items() if k.startswith("pe_floater_")}

    state = read_checkpoint(args.checkpoint)
    old_args = _model_args(state)
    new_args = converted_args(old_args, floater_options)
    stock = not issubclass(ARCH_MODEL_REGISTRY[getattr(old_args, "arch", None) or old_args._name], TransformerPEModel)

    models, _, task = load_original(args.checkpoint, getattr(args, "data", None))
    original = models[0]
    torch.manual_seed(args.seed)
    converted = task.build_model(new_args)
    mapped = convert_state_dict(original.state_dict(), converted, task.source_dictionary.pad(), stock)
    converted.load_state_dict(mapped, strict=False)
    converted.floater.zero_dynamics()
    for injector in (converted.encoder.embed_positions, converted.decoder.embed_positions):
        for bias in (injector.self_bias, injector.cross_bias):
            if bias is not None:
                with torch.no_grad():
                    bias.initial.zero_()

    diff = max_output_difference(original, converted, task.target_dictionary)
    logger.info(f"max |log p(original) - log p(FLOATER)| on a random batch: {diff:.3g}")
    if diff > args.tolerance:
        raise WarmStartError(f"the converted model differs from the original by {diff:.3g} > --tolerance "
                             f"{args.tolerance:g}; not writing {args.output}")

    save_converted(state, converted, new_args, args.output)
    n_new = sum(p.numel() for p in converted.floater.floater_parameters())
    old_arch = getattr(old_args, "arch", "transformer")
    arch = old_arch if old_arch.startswith("transformer_pe") else old_arch.replace("transformer", "transformer_pe", 1)
    if arch not in ARCH_MODEL_REGISTRY:
        arch = "transformer_pe (with the original's --encoder-*/--decoder-* sizes)"
    logger.info(f"wrote {args.output} ({n_new:,} FLOATER parameters). Fine-tune with: fairseq-train ... "
                f"--user-dir fairseq_pe --arch {arch} --pe-absolute {new_args.pe_absolute} --pe-floater-bias "
                f"--restore-file {args.output} --reset-optimizer")
    return diff


@cli
def cli_main(argv=None):
    """The console script: a :class:`~fairseq_pe.errors.UserError` ends as ``PROG: error: ...``, status 2."""
    main(argv)


if __name__ == "__main__":
    cli_main()
