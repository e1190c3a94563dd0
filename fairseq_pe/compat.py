"""Fixes for fairseq traps on current torch, applied when the plugin is imported.

Importing ``fairseq_pe`` (``--user-dir fairseq_pe`` or ``import fairseq_pe``) applies them,
so ``fairseq-train`` / ``fairseq-generate`` users never see them:

1. torch >= 2.6 loads with ``weights_only=True`` by default; fairseq checkpoints hold an
   ``argparse.Namespace``, omegaconf configs and meters, so ``fairseq-generate`` and
   ``--restore-file`` fail with ``Unsupported global: argparse.Namespace``.  fairseq's
   checkpoint loader is wrapped so that *it* loads with ``weights_only=False`` (checkpoints
   are trusted files you trained or downloaded yourself), and so is the loader of ``--ema-seed-model`` and the
   broadcast by which the other ranks of a resumed distributed training receive rank 0's checkpoint;
   every other ``torch.load`` keeps torch's default (``fairseq-pe-average-checkpoints`` replaces fairseq's
   averaging script, which pip does not install and which meets the same trap).
2. ``fairseq.data.data_utils.batch_by_size`` drops the whole last batch when its size is
   not a multiple of ``--required-batch-size-multiple`` (default 8): test sentences vanish
   from ``fairseq-generate`` and validation.  It is wrapped to append the dropped sentences
   as a final batch, so every sentence is seen exactly once.
3. User errors (a bad ``--pe-*`` value, a missing or unreadable checkpoint, a sequence longer
   than a learned table) end the process with one line ``PROG: error: ...`` and exit status 2
   instead of a traceback (:mod:`fairseq_pe.errors`); checkpoint loading reports a missing or
   corrupt file that way.
4. fairseq's fused attention fast path skips attention subclass hooks: every attention of the
   plugin's models is a :class:`fairseq_pe.models.attention.PositionAttention`, which calls torch's
   fused kernel itself after the hooks.
5. ``torchrun --nproc_per_node N fairseq-train ... --cpu --distributed-backend gloo``: on a
   machine without GPUs fairseq keeps ``--distributed-world-size`` at its default (the GPU
   count, 1), so every process trains its own model alone and they overwrite each other's
   checkpoints; given the world size it divides by ``torch.cuda.device_count()`` (0).  The
   launch-environment setup is wrapped: without GPUs, torchrun's ``WORLD_SIZE``/``RANK``
   are used as they are with GPUs, with device 0 (the CPU); and fairseq's DDP wrapper, which
   passes ``device_ids=[0]`` (refused by torch for a CPU module), passes none on the CPU.
6. ``fairseq-train --bf16``: fairseq 0.12's parser sets ``--tpu`` with it, so bf16 training on a GPU or the CPU
   asks for torch_xla and stops.  Without ``--tpu`` on the command line (and without torch_xla) it trains on the
   device it is given, with fairseq's FP16Optimizer in its bf16 form (``--memory-efficient-bf16`` likewise).
7. Position parameters with a range (KERPLE's r₁, r₂: :func:`fairseq_pe.positional.base.constrain`) are
   projected back into it after every optimizer step, in the copy the optimizer updates: the parameter itself,
   or ``--fp16``/``--bf16``'s float32 master, which fairseq copies over the model after each step.
8. ``--ddp-backend legacy_ddp`` all-reduces every gradient through one flat buffer of the first parameter's
   dtype: under ``--fp16``/``--bf16`` the float32 position parameters' gradients went through half precision.
   Each dtype is reduced in a buffer of its own.
9. A training stopped and resumed from its checkpoint ends where an uninterrupted one ends: the checkpoint also
   keeps ``--fp16``/``--bf16``'s float32 master weights (fairseq rebuilt them from the half-precision model), the
   dynamic loss scaler's counters (``--amp``: its GradScaler's scale), and the plugin's modules' training state
   that is not a parameter (FLOATER's solution reused between ``--pe-floater-refresh-updates`` refreshes).
   fairseq 0.12 only (a version guard).
"""

import contextlib
import functools
import os
import pickle
import warnings
import zipfile

import numpy as np

from fairseq_pe.errors import UserError, install_excepthook

_FORCE_NO_WEIGHTS_ONLY = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


@contextlib.contextmanager
def trusted_torch_load():
    """Within the block, ``torch.load`` calls that do not pass ``weights_only`` use ``False``."""
    previous = os.environ.get(_FORCE_NO_WEIGHTS_ONLY)
    os.environ[_FORCE_NO_WEIGHTS_ONLY] = "1"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=f".*{_FORCE_NO_WEIGHTS_ONLY}.*")
            yield
    finally:
        if previous is None:
            os.environ.pop(_FORCE_NO_WEIGHTS_ONLY, None)
        else:
            os.environ[_FORCE_NO_WEIGHTS_ONLY] = previous


#: what torch.load raises for a file that is not a (complete) torch checkpoint (OSError: a truncated zip)
_UNREADABLE = (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, UnicodeDecodeError, OSError)
_UNREADABLE_RUNTIME = ("PytorchStreamReader", "zip archive", "Invalid magic number", "invalid load key")


def _is_local(path) -> bool:
    return isinstance(path, (str, os.PathLike)) and "://" not in str(path)


def _load_checkpoint_trusted(load_checkpoint_to_cpu):
    @functools.wraps(load_checkpoint_to_cpu)
    def wrapper(path, *args, **kwargs):
        if _is_local(path) and not os.path.exists(path):
            raise UserError(f"checkpoint {path}: no such file (check --path / --restore-file)")
        try:
            with trusted_torch_load():
                state = load_checkpoint_to_cpu(path, *args, **kwargs)
        except _UNREADABLE as e:
            raise UserError(f"checkpoint {path} cannot be read ({type(e).__name__}: {e}): it is not a complete "
                            "fairseq checkpoint (truncated or another kind of file?)") from e
        except RuntimeError as e:
            if not any(marker in str(e) for marker in _UNREADABLE_RUNTIME):
                raise
            raise UserError(f"checkpoint {path} cannot be read ({e}): it is not a complete fairseq checkpoint "
                            "(truncated or another kind of file?)") from e
        from fairseq_pe.models.options import upgrade_checkpoint_options

        return upgrade_checkpoint_options(state)  # options that fairseq-pe 0.1 saved mean what they meant then

    wrapper._fairseq_pe_patched = True
    return wrapper


def _batch_by_size_keeping_every_sentence(batch_by_size):
    @functools.wraps(batch_by_size)
    def wrapper(indices, num_tokens_fn, *args, **kwargs):
        batches = batch_by_size(indices, num_tokens_fn, *args, **kwargs)
        indices = np.asarray(indices, dtype=np.int64)
        covered = sum(len(b) for b in batches)
        if covered < len(indices):
            seen = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if batches else np.zeros(0, np.int64)
            missing = indices[~np.isin(indices, seen)]
            batches = list(batches) + [missing]
        return batches

    wrapper._fairseq_pe_patched = True
    return wrapper


def _ema_seed_trusted(load_ema_from_checkpoint):
    """``--ema-seed-model``: fairseq's EMA loads the seed checkpoint with a plain ``torch.load`` (fix 1)."""
    @functools.wraps(load_ema_from_checkpoint)
    def wrapper(path, *args, **kwargs):
        if _is_local(path) and not os.path.exists(path):
            raise UserError(f"--ema-seed-model {path}: no such checkpoint file")
        with trusted_torch_load():
            return load_ema_from_checkpoint(path, *args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _broadcast_trusted(broadcast_object):
    """A resumed distributed training: rank 0 loads the checkpoint (trusted, fix 1) and fairseq broadcasts it to the
    other ranks as a ``torch.save`` of it, which they read back with a plain ``torch.load``: torch >= 2.6 refused
    its configuration (omegaconf's ``DictConfig``), so every multi-process resume failed on rank 1."""
    @functools.wraps(broadcast_object)
    def wrapper(*args, **kwargs):
        with trusted_torch_load():
            return broadcast_object(*args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _model_files_checked(load_model_ensemble_and_task):
    @functools.wraps(load_model_ensemble_and_task)
    def wrapper(filenames, *args, **kwargs):
        if kwargs.get("num_shards", 1) == 1 and not kwargs.get("suffix"):
            for name in filenames:
                if _is_local(name) and not os.path.exists(name):
                    raise UserError(f"--path {name}: no such checkpoint file")
        return load_model_ensemble_and_task(filenames, *args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _binding_limit(max_positions):
    """``(limit, why)`` of the smallest of fairseq's ``max_positions`` (an int, a tuple of ints, or a dict of them)
    when it is the model's and names the option that sets it (a
    :class:`~fairseq_pe.positional.injector.PositionLimit`); else None (the task's limit binds)."""
    values = max_positions.values() if isinstance(max_positions, dict) else (
        max_positions if isinstance(max_positions, (tuple, list)) else [max_positions])
    flat = []
    for value in values:
        flat.extend(value if isinstance(value, (tuple, list)) else [value])
    flat = [v for v in flat if v is not None]
    named = [v for v in flat if getattr(v, "why", None) is not None]
    if not named:
        return None
    smallest = min(named)
    return (int(smallest), smallest.why) if all(smallest <= v for v in flat) else None


def _size_errors_named(filter_indices_by_size):
    """fairseq refuses a sentence longer than the model or the task allows (``fairseq-generate``), or skips it with
    one line (training): the refusal names the option that sets the limit; a training that skips pairs because of
    the plugin's option (a learned table's length, ``--pe-random-positions``) says how many, once."""
    @functools.wraps(filter_indices_by_size)
    def wrapper(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        limit = _binding_limit(max_positions)
        try:
            kept = filter_indices_by_size(self, indices, dataset, max_positions, ignore_invalid_inputs)
        except Exception as e:  # fairseq raises a bare Exception here
            if type(e) is not Exception or not str(e).startswith("Size of sample"):
                raise
            if limit:
                raise UserError(f"{e}. The model's limit, {limit[0]}, is {limit[1]}") from e
            raise UserError(f"{e}. The limit is the smaller of the task's --max-source-positions/"
                            "--max-target-positions and the model's; raise the task's limits") from e
        dropped = len(indices) - len(kept)
        if dropped and limit:
            import logging

            logging.getLogger("fairseq_pe").warning(
                f"{dropped:,} of {len(indices):,} examples are longer than the model's limit, {limit[0]} tokens, and "
                f"are skipped: the limit is {limit[1]}")
        return kept

    wrapper._fairseq_pe_patched = True
    return wrapper


def _torchrun_on_cpu(infer_init_method):
    @functools.wraps(infer_init_method)
    def wrapper(cfg, *args, **kwargs):
        import torch

        launched = all(k in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"))
        if launched and torch.cuda.device_count() == 0 and cfg.distributed_init_method is None \
                and not getattr(cfg, "tpu", False):
            world = int(os.environ["WORLD_SIZE"])
            if cfg.distributed_world_size not in (1, world):
                raise ValueError(f"--distributed-world-size {cfg.distributed_world_size} contradicts torchrun's "
                                 f"WORLD_SIZE={world}; drop the flag")
            if world > 1:
                cfg.distributed_init_method = "env://"
                cfg.distributed_world_size = world
                cfg.distributed_rank = int(os.environ["RANK"])
                cfg.device_id = 0
                cfg.distributed_no_spawn = True  # torchrun created the processes
                return
        return infer_init_method(cfg, *args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _ddp_on_cpu(factory):
    import sys

    @functools.wraps(factory)
    def wrapper(args, model, process_group, device, *rest, **kwargs):
        on_cpu = getattr(device, "type", str(device)) == "cpu"
        if not (on_cpu and getattr(args, "ddp_backend", None) in {"c10d", "pytorch_ddp"}):
            return factory(args, model, process_group, device, *rest, **kwargs)
        module = sys.modules[factory.__module__]
        ddp = module.DistributedDataParallel

        def cpu_ddp(*a, device_ids=None, output_device=None, **kw):
            return ddp(*a, **kw)

        module.DistributedDataParallel = cpu_ddp
        try:
            return factory(args, model, process_group, device, *rest, **kwargs)
        finally:
            module.DistributedDataParallel = ddp

    wrapper._fairseq_pe_patched = True
    return wrapper


def _constrained(params):
    """(tensor, bounds) of the parameters marked by :func:`fairseq_pe.positional.base.constrain`."""
    return [(p.data, p.pe_bounds) for p in params if getattr(p, "pe_bounds", None) is not None]


def _projected_after_step(step):
    """``FairseqOptimizer.step``: then project the constrained parameters it updates (plain optimizers, and
    the wrapped optimizer of ``--memory-efficient-fp16``/``-bf16``, ``--amp`` and BMUF)."""
    @functools.wraps(step)
    def wrapper(self, *args, **kwargs):
        from fairseq_pe.positional.base import project_

        result = step(self, *args, **kwargs)
        constrained = getattr(self, "_fairseq_pe_constrained", None)
        if constrained is None:  # the parameter groups are fixed: found once
            constrained = self._fairseq_pe_constrained = _constrained(self.params)
        for tensor, bounds in constrained:
            project_(tensor, bounds)
        return result

    wrapper._fairseq_pe_patched = True
    return wrapper


def _fp16_masters(optimizer):
    """(master copy, bounds) of every constrained parameter of fairseq's ``FP16Optimizer`` (``--fp16``,
    ``--bf16``): a slice of the flat float32 buffer (laid out as ``_sync_fp32_params_to_fp16`` reads it), or the
    parameter's own float32 copy."""
    if not optimizer.has_flat_params:
        return [(p32.data, p.pe_bounds) for p, p32 in zip(optimizer.fp16_params, optimizer.fp32_params)
                if getattr(p, "pe_bounds", None) is not None]
    by_device = {}
    for p in optimizer.fp16_params:
        by_device.setdefault(p.device.index, []).append(p)
    masters = []
    for device, flat in optimizer.fp32_params.items():
        offset = 0
        for p in by_device.get(device, []):
            if getattr(p, "pe_bounds", None) is not None:
                masters.append((flat.data[offset:offset + p.numel()], p.pe_bounds))
            offset += p.numel()
    return masters


def _masters_projected(sync):
    """``FP16Optimizer``'s copy of its float32 masters into the model: project the constrained masters first, so
    that the optimizer's next step starts from the values the model uses (fairseq would otherwise copy its
    unprojected master over the model's parameter after every step)."""
    @functools.wraps(sync)
    def wrapper(self):
        from fairseq_pe.positional.base import project_

        masters = getattr(self, "_fairseq_pe_masters", None)
        if masters is None:
            masters = self._fairseq_pe_masters = _fp16_masters(self)
        for tensor, bounds in masters:
            project_(tensor, bounds)
        return sync(self)

    wrapper._fairseq_pe_patched = True
    return wrapper


def _reduced_per_dtype(all_reduce_grads):
    """``--ddp-backend legacy_ddp``: all-reduce the gradients of each dtype in a buffer of that dtype.  fairseq's
    one flat buffer takes the dtype of the model's first parameter, so under ``--fp16``/``--bf16`` the gradients
    of the float32 position parameters (kept float32 by :class:`~fairseq_pe.positional.base.Float32State`) were
    rounded to half precision, or overflowed, on their way through it."""
    @functools.wraps(all_reduce_grads)
    def wrapper(self):
        import torch

        groups = {}  # dtype -> the per-device lists of its parameters
        for params in self.per_device_params:
            by_dtype = {}
            for p in params:
                by_dtype.setdefault(p.dtype, []).append(p)
            for dtype, same in by_dtype.items():
                groups.setdefault(dtype, []).append(same)
        if len(groups) <= 1:
            return all_reduce_grads(self)
        buffers = self.__dict__.setdefault("_fairseq_pe_buffers", {})
        per_device_params, buffer = self.per_device_params, self.buffer
        try:
            for dtype, per_device in groups.items():
                if dtype not in buffers:
                    size = min(self.buffer_size, max(sum(p.numel() for p in ps) for ps in per_device))
                    buffers[dtype] = torch.zeros(size, dtype=dtype, device=per_device[0][0].device)
                self.per_device_params, self.buffer = per_device, buffers[dtype]
                all_reduce_grads(self)
        finally:
            self.per_device_params, self.buffer = per_device_params, buffer
        return None

    wrapper._fairseq_pe_patched = True
    return wrapper


def _bf16_without_tpu(parse_args_and_arch):
    """fairseq 0.12's parser turns ``--bf16`` into ``--tpu`` (bf16 was a TPU feature when it was written): on a GPU
    or the CPU, ``fairseq-train --bf16`` then asks for torch_xla and stops.  Unless ``--tpu`` is on the command line
    or torch_xla is installed, ``--bf16`` trains on the device it is given, as ``--fp16`` does (bf16 weights,
    fairseq's FP16Optimizer with float32 masters and no loss scaling, or ``--memory-efficient-bf16``)."""
    @functools.wraps(parse_args_and_arch)
    def wrapper(parser, input_args=None, *args, **kwargs):
        import importlib.util
        import sys

        parsed = parse_args_and_arch(parser, input_args, *args, **kwargs)
        namespace = parsed[0] if isinstance(parsed, tuple) else parsed
        given = sys.argv[1:] if input_args is None else input_args
        if getattr(namespace, "bf16", False) and getattr(namespace, "tpu", False) and "--tpu" not in given \
                and importlib.util.find_spec("torch_xla") is None:
            namespace.tpu = False
        return parsed

    wrapper._fairseq_pe_patched = True
    return wrapper


# ---- fix 9: a stopped training resumes where it stopped ---------------------------------------------------------
#
# fairseq seeds every update (seed + num_updates), so a training stopped after K updates and resumed from its
# checkpoint must end where an uninterrupted one ends.  fairseq 0.12 keeps two kinds of training state out of its
# checkpoints:
#
# * ``--fp16``/``--bf16`` (``FP16Optimizer``): the float32 master weights.  Its ``state_dict`` holds the wrapped
#   optimizer's state and the loss scale only; on resume ``Trainer.load_checkpoint`` loads the half-precision model,
#   rebuilds the optimizer (``_build_optimizer``: masters copied from the rounded model) and then loads the optimizer
#   state, so every resumed run lost the masters' low bits (KERPLE-power under --bf16: 7.8e-3 apart after 12 updates,
#   5 + 7 resumed).  Both forms are kept: the flat float32 buffer of --fp16 and the per-parameter copies of --bf16.
#   The dynamic loss scaler keeps its scale but loses its counters (``_iter``, the last overflow and rescale), so a
#   resumed --fp16 run grew its scale at other updates; they are kept too (also for ``MemoryEfficientFP16Optimizer``),
#   and so are ``--amp``'s GradScaler's scale and growth tracker (fairseq saved neither: the scale restarted from
#   ``--fp16-init-scale``).
#   ``MemoryEfficientFP16Optimizer`` (--memory-efficient-fp16/-bf16) has no masters: its half-precision parameters
#   are the weights it updates and are saved as they are, and fairseq itself keeps its float32 moments from torch's
#   cast on load; with the scaler's counters its resume is exact (tests/test_resume.py checks it).
# * the plugin's modules' state that is not a parameter: FLOATER's solution reused between refreshes
#   (``--pe-floater-refresh-updates``: FLOATER at every block with a refresh every 3 updates ended 6.7e-3 to 7.8e-3
#   apart in float32, the resumed run solving afresh in the middle of a period).  A module of the model that
#   defines ``training_state()`` / ``load_training_state(state)`` has that state saved in the checkpoint's
#   ``extra_state`` (under its name in the model) and restored after the model loads, unless the optimizer is reset
#   (``--reset-optimizer``: a new training).  It is not in the model's state dict, so
#   generation, averaging and the analysis tools never see it.  Under DDP the checkpoint holds rank 0's (each rank
#   solves for its own batch, and may solve again within a period for a longer one): every rank resumes with it.
#
# Checkpoints written before this fix load as before (masters rebuilt from the model, a fresh FLOATER solve).

#: fairseq releases whose checkpoints lack this state (the wrappers below rely on 0.12's FP16Optimizer layout and
#: Trainer.state_dict/load_checkpoint); another release gets a warning and fairseq's own behaviour
_EXACT_RESUME_FAIRSEQ = ("0.12.",)
_MASTERS_KEY = "fairseq_pe_fp32_masters"
_SCALER_KEY = "fairseq_pe_loss_scaler"
_SCALER_COUNTERS = ("_iter", "_last_overflow_iter", "_last_rescale_iter", "_overflows_since_rescale")
_TRAINING_STATE_KEY = "fairseq_pe_training_state"


def _master_tensors(optimizer):
    """``FP16Optimizer``'s float32 masters, in a fixed order: its flat buffer (one per device, as many as it was
    built with) or its per-parameter copies (bf16, ``--fp16-no-flatten-grads``)."""
    if optimizer.has_flat_params:
        flat = optimizer.fp32_params
        return list(flat.values()) if isinstance(flat, dict) else [flat]
    return list(optimizer.fp32_params)


def _with_scaler_counters(optimizer, state):
    scaler = getattr(optimizer, "scaler", None)
    if scaler is not None and all(hasattr(scaler, name) for name in _SCALER_COUNTERS):
        state[_SCALER_KEY] = {name: getattr(scaler, name) for name in _SCALER_COUNTERS}
    return state


def _restore_scaler_counters(optimizer, counters):
    scaler = getattr(optimizer, "scaler", None)
    if counters is not None and scaler is not None:
        for name, value in counters.items():
            setattr(scaler, name, value)


def _half_precision_state_saved(state_dict):
    """``FP16Optimizer.state_dict`` and ``MemoryEfficientFP16Optimizer.state_dict``: also the float32 masters (the
    former; the tensors themselves, not copies, as torch's optimizer state dict holds its moments: fairseq writes the
    checkpoint at once) and the loss scaler's counters."""
    @functools.wraps(state_dict)
    def wrapper(self):
        state = _with_scaler_counters(self, state_dict(self))
        if hasattr(self, "fp32_params"):
            state[_MASTERS_KEY] = [t.data for t in _master_tensors(self)]
        return state

    wrapper._fairseq_pe_patched = True
    return wrapper


def _half_precision_state_loaded(load_state_dict):
    """``load_state_dict`` of both: fairseq's load first (the wrapped optimizer's state, the loss scale), then the
    masters saved with it, over those ``Trainer._build_optimizer`` has just copied from the half-precision model.
    A checkpoint without them (written before this fix) keeps fairseq's rebuilt masters; one whose masters do not
    fit this optimizer (another model or layout) too, with a warning."""
    @functools.wraps(load_state_dict)
    def wrapper(self, state_dict, *args, **kwargs):
        state_dict = dict(state_dict)
        masters = state_dict.pop(_MASTERS_KEY, None)
        counters = state_dict.pop(_SCALER_KEY, None)
        result = load_state_dict(self, state_dict, *args, **kwargs)
        _restore_scaler_counters(self, counters)
        if masters is not None and hasattr(self, "fp32_params"):
            import torch

            targets = _master_tensors(self)
            if len(targets) != len(masters) or any(t.shape != m.shape for t, m in zip(targets, masters)):
                import logging

                logging.getLogger("fairseq_pe").warning(
                    "the checkpoint's float32 master weights do not fit this optimizer (another model, or "
                    "--fp16-no-flatten-grads changed): they are rebuilt from the half-precision model, as fairseq "
                    "does, and the resumed training is not exactly the uninterrupted one")
            else:
                with torch.no_grad():
                    for target, saved in zip(targets, masters):
                        target.data.copy_(saved)
        return result

    wrapper._fairseq_pe_patched = True
    return wrapper


def _grad_scaler_state_saved(state_dict):
    """``AMPOptimizer.state_dict`` (``--amp``): also its ``GradScaler``'s scale and growth tracker (fairseq kept
    neither, so a resumed run restarted from ``--fp16-init-scale``)."""
    @functools.wraps(state_dict)
    def wrapper(self):
        state = state_dict(self)
        scaler = getattr(self, "_grad_scaler", None)
        if scaler is not None and scaler.is_enabled():
            saved = scaler.state_dict()
            state[_SCALER_KEY] = {"scale": saved["scale"], "_growth_tracker": saved["_growth_tracker"]}
        return state

    wrapper._fairseq_pe_patched = True
    return wrapper


def _grad_scaler_state_loaded(load_state_dict):
    """``AMPOptimizer.load_state_dict``: the saved scale and growth tracker; the growth interval and factors stay
    this run's (fairseq prefers the options of the resumed run)."""
    @functools.wraps(load_state_dict)
    def wrapper(self, state_dict, *args, **kwargs):
        state_dict = dict(state_dict)
        saved = state_dict.pop(_SCALER_KEY, None)
        result = load_state_dict(self, state_dict, *args, **kwargs)
        scaler = getattr(self, "_grad_scaler", None)
        if saved is not None and scaler is not None and scaler.is_enabled():
            scaler.load_state_dict({**scaler.state_dict(), **saved})
        return result

    wrapper._fairseq_pe_patched = True
    return wrapper


def _modules_with_training_state(model):
    return [(name, module) for name, module in model.named_modules()
            if callable(getattr(module, "training_state", None))
            and callable(getattr(module, "load_training_state", None))]


def _training_state_saved(state_dict):
    """``Trainer.state_dict``: the plugin's modules' training state in ``extra_state``."""
    @functools.wraps(state_dict)
    def wrapper(self):
        state = state_dict(self)
        kept = {}
        for name, module in _modules_with_training_state(self.model):
            module_state = module.training_state()
            if module_state:
                kept[name] = module_state
        if kept:
            state["extra_state"][_TRAINING_STATE_KEY] = kept
        return state

    wrapper._fairseq_pe_patched = True
    return wrapper


def _training_state_loaded(load_checkpoint):
    """``Trainer.load_checkpoint``: after fairseq has loaded the model (which drops such state: the module's own
    ``_load_from_state_dict``), each module gets what the checkpoint kept for it, unless the optimizer is reset."""
    @functools.wraps(load_checkpoint)
    def wrapper(self, filename, reset_optimizer=False, *args, **kwargs):
        extra_state = load_checkpoint(self, filename, reset_optimizer, *args, **kwargs)
        kept = (extra_state or {}).get(_TRAINING_STATE_KEY)
        if kept and not reset_optimizer:
            for name, module in _modules_with_training_state(self.model):
                if name in kept:
                    module.load_training_state(kept[name])
        return extra_state

    wrapper._fairseq_pe_patched = True
    return wrapper


def _apply_exact_resume():
    """Fix 9, for the fairseq releases of :data:`_EXACT_RESUME_FAIRSEQ` only."""
    import fairseq
    from fairseq.optim.amp_optimizer import AMPOptimizer
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin, _MemoryEfficientFP16OptimizerMixin
    from fairseq.trainer import Trainer

    version = getattr(fairseq, "__version__", "unknown")
    if not version.startswith(_EXACT_RESUME_FAIRSEQ):
        import logging

        logging.getLogger("fairseq_pe").warning(
            f"fairseq {version}: fairseq-pe's exact-resume fix (float32 masters, loss-scaler counters and FLOATER's "
            f"refresh in the checkpoint) is written for fairseq {', '.join(_EXACT_RESUME_FAIRSEQ)}x and is not "
            "applied; a resumed --fp16/--bf16 or --pe-floater-refresh-updates training may differ from an "
            "uninterrupted one")
        return
    for mixin in (_FP16OptimizerMixin, _MemoryEfficientFP16OptimizerMixin):
        _patch(mixin, "state_dict", _half_precision_state_saved)
        _patch(mixin, "load_state_dict", _half_precision_state_loaded)
    _patch(AMPOptimizer, "state_dict", _grad_scaler_state_saved)
    _patch(AMPOptimizer, "load_state_dict", _grad_scaler_state_loaded)
    _patch(Trainer, "state_dict", _training_state_saved)
    _patch(Trainer, "load_checkpoint", _training_state_loaded)


def _patch(owner, name: str, wrap):
    """Replace ``owner.name`` by ``wrap(owner.name)``, once (the wrappers mark themselves ``_fairseq_pe_patched``)."""
    original = getattr(owner, name)
    if not getattr(original, "_fairseq_pe_patched", False):
        setattr(owner, name, wrap(original))


def apply():
    from fairseq import checkpoint_utils, models, options
    from fairseq.data import data_utils
    from fairseq.distributed import LegacyDistributedDataParallel
    from fairseq.distributed import utils as distributed_utils
    from fairseq.optim import FairseqOptimizer
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin
    from fairseq.tasks import FairseqTask

    install_excepthook()
    _patch(models, "DistributedFairseqModel", _ddp_on_cpu)
    _patch(distributed_utils, "infer_init_method", _torchrun_on_cpu)
    _patch(distributed_utils, "broadcast_object", _broadcast_trusted)
    _patch(FairseqTask, "filter_indices_by_size", _size_errors_named)
    _patch(checkpoint_utils, "load_model_ensemble_and_task", _model_files_checked)
    _patch(checkpoint_utils, "load_checkpoint_to_cpu", _load_checkpoint_trusted)
    _patch(checkpoint_utils, "load_ema_from_checkpoint", _ema_seed_trusted)
    _patch(data_utils, "batch_by_size", _batch_by_size_keeping_every_sentence)
    _patch(options, "parse_args_and_arch", _bf16_without_tpu)
    _patch(LegacyDistributedDataParallel, "all_reduce_grads", _reduced_per_dtype)
    _patch(FairseqOptimizer, "step", _projected_after_step)
    _patch(_FP16OptimizerMixin, "_sync_fp32_params_to_fp16", _masters_projected)
    _apply_exact_resume()
