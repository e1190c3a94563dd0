"""Fix 1: fairseq's checkpoints load on torch >= 2.6 without running code, and a missing or unreadable one is a
one-line user error.

torch >= 2.6 loads with ``weights_only=True`` by default; fairseq 0.12's checkpoints hold an ``argparse.Namespace``
(and, in the copy a resumed distributed training broadcasts, omegaconf's configuration), so ``fairseq-generate`` and
``--restore-file`` failed with ``Unsupported global: argparse.Namespace``.  fairseq's checkpoint loader (and
``--ema-seed-model``'s, and the broadcast by which the other ranks of a resumed distributed training receive rank 0's
checkpoint) loads them with ``weights_only=True`` and the allowlist of :mod:`fairseq_pe.safe_load`: a file that needs
more is refused naming what it needs, unless ``FAIRSEQ_PE_TRUST_CHECKPOINTS=1`` trusts it; a missing or corrupt
file is a :class:`~fairseq_pe.errors.UserError` naming it.  Checkpoints written by fairseq-pe 0.1 get their options
upgraded (:func:`fairseq_pe.models.options.upgrade_checkpoint_options`).  What a loaded checkpoint cannot become
is one line too: an architecture that no registry holds (fairseq's ``KeyError``/``IndexError``), and weights that do
not fit the model built for the command (torch's "Error(s) in loading state_dict", one line per key: the likely
cause named, a ``--model-overrides`` that adds parameters or another data folder's dictionaries).

Extension point: none; fairseq 0.12 has no hook around ``torch.load``, its option upgrade, ``models.build_model`` or
the ensemble's ``load_state_dict`` in ``checkpoint_utils`` (wrappers, once).
"""

import functools
import os
import pickle
import re
import zipfile

from fairseq_pe.compat.patching import fairseq_matches, patch
from fairseq_pe.errors import UserError
from fairseq_pe.safe_load import checkpoint_loading

#: the fairseq releases this fix is written for
FIXES_FAIRSEQ = ("0.12.",)
#: it changes stock fairseq's behaviour for every task of the process (docs/install.md lists it)
CHANGES_STOCK = True
SUMMARY = ("checkpoints of fairseq 0.12 load on torch >= 2.6 with weights_only=True and an allowlist (fairseq's "
           "loader, --ema-seed-model, the resume broadcast)")

#: what torch.load raises for a file that is not a (complete) torch checkpoint (OSError: a truncated zip)
_UNREADABLE = (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, UnicodeDecodeError, OSError)
_UNREADABLE_RUNTIME = ("PytorchStreamReader", "zip archive", "Invalid magic number", "invalid load key")


def _is_local(path) -> bool:
    return isinstance(path, (str, os.PathLike)) and "://" not in str(path)


#: what fairseq's loaders raise reading a loaded object that is no checkpoint (a bare tensor, a dict without
#: ``model``, ``extra_state`` or ``ema``): one line naming the file and what it holds
_NOT_A_CHECKPOINT = (KeyError, TypeError, AttributeError, IndexError)


def _read_as_user_errors(what: str, load):
    """``load()`` with a file that cannot be read, or holds no fairseq checkpoint, reported in one line."""
    try:
        return load()
    except _UNREADABLE as e:
        if isinstance(e, IsADirectoryError):
            raise UserError(f"{what} is a folder, not a checkpoint file") from None
        raise UserError(f"{what} cannot be read ({type(e).__name__}: {e}): it is not a complete fairseq checkpoint "
                        "(truncated or another kind of file?)") from e
    except RuntimeError as e:
        if "Tensor.__contains__" in str(e):  # fairseq's `"args" in state` of a file that holds a bare tensor
            raise UserError(f"{what} is not a fairseq checkpoint: it holds a bare tensor; a fairseq checkpoint is a "
                            "dict with 'model', 'cfg' or 'args', and 'extra_state'") from None
        if not any(marker in str(e) for marker in _UNREADABLE_RUNTIME):
            raise
        raise UserError(f"{what} cannot be read ({e}): it is not a complete fairseq checkpoint (truncated or "
                        "another kind of file?)") from e
    except _NOT_A_CHECKPOINT as e:
        if isinstance(e, KeyError) and e.args == ("ema",):
            raise UserError(f"{what} holds no EMA weights (its extra_state has no 'ema': a checkpoint of a training "
                            "with --store-ema is needed)") from None
        raise UserError(f"{what} is not a fairseq checkpoint ({type(e).__name__}: {e}): a fairseq checkpoint is a "
                        "dict with 'model', 'cfg' or 'args', and 'extra_state'") from None


class UnknownArchitecture(UserError):
    """A checkpoint whose model architecture is not registered in this process."""


def _unknown_architecture(name, field: str):
    """An :class:`UnknownArchitecture` for ``name`` where no registry of fairseq's holds it, else None."""
    import difflib

    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY, MODEL_REGISTRY

    known = {*ARCH_MODEL_REGISTRY, *MODEL_REGISTRY, *MODEL_DATACLASS_REGISTRY}
    if not isinstance(name, str) or name in known:
        return None
    close = difflib.get_close_matches(name, sorted(known), n=3)
    return UnknownArchitecture(
        f"its model architecture {name!r} ({field}) is not registered in this process: a plugin's architecture "
        "needs the plugin's --user-dir (fairseq-pe's: --user-dir fairseq_pe)"
        + (f"; registered names close to it: {', '.join(close)}" if close else ""))


def _architecture_checked(upgrade_state_dict):
    """A checkpoint of fairseq's old format (``args``) names an architecture that is not registered: fairseq's
    conversion of its options failed with ``KeyError: 'NAME'``; one line naming it."""
    @functools.wraps(upgrade_state_dict)
    def wrapper(state, *args, **kwargs):
        old = state.get("args") if isinstance(state, dict) else None
        unknown = _unknown_architecture(getattr(old, "arch", None), "args.arch") if old is not None else None
        if unknown is not None:
            raise unknown
        return upgrade_state_dict(state, *args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _build_checked(build_model):
    """A model configuration (a checkpoint's ``cfg.model``) whose architecture is not registered: fairseq's
    ``build_model`` failed formatting its own message (``IndexError``); one line naming it.  A checkpoint that is
    only read (averaged, say) is not built, and keeps loading."""
    @functools.wraps(build_model)
    def wrapper(cfg, *args, **kwargs):
        name = getattr(cfg, "_name", None) or getattr(cfg, "arch", None)
        unknown = _unknown_architecture(name, "cfg.model._name" if getattr(cfg, "_name", None) else "cfg.model.arch")
        if unknown is not None:
            raise unknown
        return build_model(cfg, *args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _load_checkpoint_safely(load_checkpoint_to_cpu):
    @functools.wraps(load_checkpoint_to_cpu)
    def wrapper(path, *args, **kwargs):
        if _is_local(path) and not os.path.exists(path):
            raise UserError(f"checkpoint {path}: no such file (check --path / --restore-file)")

        def load():
            with checkpoint_loading(f"checkpoint {path}", path if _is_local(path) else None):
                loaded = load_checkpoint_to_cpu(path, *args, **kwargs)
            if not isinstance(loaded, dict) or "model" not in loaded:
                raise KeyError("model")
            return loaded

        try:
            state = _read_as_user_errors(f"checkpoint {path}", load)
        except UnknownArchitecture as e:
            raise UnknownArchitecture(f"checkpoint {path}: {e}") from None
        from fairseq_pe.compat.literal_options import check_options
        from fairseq_pe.models.options import upgrade_checkpoint_options

        # options that fairseq-pe 0.1 saved mean what they meant then; none that fairseq evaluates runs code
        return check_options(upgrade_checkpoint_options(state), f"checkpoint {path}")

    wrapper._fairseq_pe_patched = True
    return wrapper


def _ema_seed_safely(load_ema_from_checkpoint):
    """``--ema-seed-model``: fairseq's EMA loads the seed checkpoint with a plain ``torch.load``: safely (fix 1)."""
    @functools.wraps(load_ema_from_checkpoint)
    def wrapper(path, *args, **kwargs):
        if _is_local(path) and not os.path.exists(path):
            raise UserError(f"--ema-seed-model {path}: no such checkpoint file")

        def load():
            with checkpoint_loading(f"--ema-seed-model {path}", path if _is_local(path) else None):
                return load_ema_from_checkpoint(path, *args, **kwargs)

        return _read_as_user_errors(f"--ema-seed-model {path}", load)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _broadcast_safely(broadcast_object):
    """A resumed distributed training: rank 0 loads the checkpoint (fix 1) and fairseq broadcasts it to the other
    ranks as a ``torch.save`` of it, which they read back with a plain ``torch.load``: torch >= 2.6 refused its
    configuration (omegaconf's ``DictConfig``), so every multi-process resume failed on rank 1.  They read it with
    the same allowlist (which has omegaconf's classes and the broadcast's tensor placeholders), or trust it where
    ``FAIRSEQ_PE_TRUST_CHECKPOINTS=1`` trusted the file on rank 0."""
    @functools.wraps(broadcast_object)
    def wrapper(*args, **kwargs):
        with checkpoint_loading("the checkpoint that rank 0 broadcast"):
            return broadcast_object(*args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _listed(names, most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def weights_mismatch(error: RuntimeError, filenames, overrides) -> UserError:
    """torch's "Error(s) in loading state_dict" (one line per key) as one line: the checkpoint's weights do not
    fit the model built from its options with the command's task, data and ``--model-overrides``; the likely
    cause named (an override that adds or removes parameters, another data folder's dictionaries)."""
    text = str(error)
    missing = re.findall(r'"([^"]+)"', (re.search(r"Missing key\(s\) in state_dict:([^\n]*)", text) or ["", ""])[1])
    unexpected = re.findall(r'"([^"]+)"',
                            (re.search(r"Unexpected key\(s\) in state_dict:([^\n]*)", text) or ["", ""])[1])
    sizes = re.findall(r"size mismatch for ([^:]+): copying a param with shape torch\.Size\((\[[^\]]*\])\) from "
                       r"checkpoint, the shape in current model is torch\.Size\((\[[^\]]*\])\)", text)
    parts = ([f"the model has {len(missing)} weights the file lacks ({_listed(missing)})"] if missing else []) + \
        ([f"the file has {len(unexpected)} the model lacks ({_listed(unexpected)})"] if unexpected else []) + \
        ([f"{len(sizes)} differ in shape ({_listed([f'{n}: {a} in the file, {b} in the model' for n, a, b in sizes], 2)})"]
         if sizes else [])
    names = [str(name) for name in filenames]
    what = f"checkpoint {names[0]}" if len(names) == 1 else f"one of the checkpoints {', '.join(names)}"
    user_overrides = {k: v for k, v in (overrides or {}).items() if k != "data"}
    if user_overrides and (missing or unexpected):
        cause = (f"--model-overrides {user_overrides} changes which weights the model has; an override may change "
                 "how a trained model computes (e.g. --pe-rope-scaling), not which parameters it has")
    elif any(name.endswith(("embed_tokens.weight", "output_projection.weight")) for name, _, _ in sizes):
        cause = ("the dictionaries of the data folder are not the ones it was trained with (their sizes differ): give "
                 "the data folder it was trained on, or the model's task (--task)")
    else:
        cause = "the options of the command (--task, --model-overrides, the data folder) build another model"
    return UserError(f"{what}: its weights do not fit the model built for this command: {'; '.join(parts) or text}: "
                     f"{cause}")


def _model_files_checked(load_model_ensemble_and_task):
    @functools.wraps(load_model_ensemble_and_task)
    def wrapper(filenames, *args, **kwargs):
        if kwargs.get("num_shards", 1) == 1 and not kwargs.get("suffix"):
            for name in filenames:
                if _is_local(name) and not os.path.exists(name):
                    raise UserError(f"--path {name}: no such checkpoint file")
        try:
            return load_model_ensemble_and_task(filenames, *args, **kwargs)
        except UnknownArchitecture as e:
            if len(filenames) != 1 or str(e).startswith("checkpoint "):
                raise
            raise UnknownArchitecture(f"checkpoint {filenames[0]}: {e}") from None
        except RuntimeError as e:
            if "Error(s) in loading state_dict" not in str(e):
                raise
            overrides = kwargs.get("arg_overrides", args[0] if args else None)
            raise weights_mismatch(e, filenames, overrides) from e

    wrapper._fairseq_pe_patched = True
    return wrapper


def _why_not_a_file(path: str) -> str:
    """Why ``path`` is not a checkpoint file to load: a folder, a dangling or looping link, or nothing there."""
    if os.path.isdir(path):
        return "is a folder, not a checkpoint file"
    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as e:
            return "is a symbolic link loop" if e.errno == 40 else "is a dangling symbolic link"
    return "no such file"


def _restore_path_checked(load_checkpoint):
    """``--restore-file PATH`` (not fairseq's default ``checkpoint_last.pt``), ``--finetune-from-model PATH`` and
    ``--continue-once PATH`` of a first launch name a file the user wants trained from: where it is not a file,
    fairseq's Trainer logged "No existing checkpoint found", trained from scratch and overwrote ``--save-dir``'s
    checkpoints.  Here that is one line naming the option, before anything is written."""
    @functools.wraps(load_checkpoint)
    def wrapper(cfg, trainer, **kwargs):
        suffix = trainer.checkpoint_suffix
        asked = None
        if cfg.restore_file != "checkpoint_last.pt":
            path = cfg.restore_file.replace(".pt", suffix + ".pt") if suffix is not None else cfg.restore_file
            asked = ("--restore-file", path)
        elif not os.path.exists(os.path.join(cfg.save_dir, f"checkpoint_last{suffix or ''}.pt")):
            if getattr(cfg, "continue_once", None) is not None:
                asked = ("--continue-once", cfg.continue_once)
            elif cfg.finetune_from_model is not None:
                asked = ("--finetune-from-model", cfg.finetune_from_model)
        from fairseq_pe.errors import hydra_user_errors

        with hydra_user_errors():  # fairseq-hydra-train: one line (fairseq_pe.compat.hydra_errors)
            if asked is not None and _is_local(asked[1]) and not os.path.isfile(asked[1]):
                flag, path = asked
                raise UserError(f"{flag} {path}: {_why_not_a_file(path)}; nothing was trained or written (fairseq "
                                f"would have trained from scratch over {cfg.save_dir})")
            return load_checkpoint(cfg, trainer, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "checkpoint_loading",
                           "fairseq's checkpoints may not load on this torch (weights_only)"):
        return False
    from fairseq import checkpoint_utils, models
    from fairseq.distributed import utils as distributed_utils

    patch(distributed_utils, "broadcast_object", _broadcast_safely)
    patch(checkpoint_utils, "load_model_ensemble_and_task", _model_files_checked)
    patch(checkpoint_utils, "load_checkpoint_to_cpu", _load_checkpoint_safely)
    patch(checkpoint_utils, "load_ema_from_checkpoint", _ema_seed_safely)
    patch(checkpoint_utils, "load_checkpoint", _restore_path_checked)
    patch(checkpoint_utils, "_upgrade_state_dict", _architecture_checked)
    patch(models, "build_model", _build_checked)
    return True
