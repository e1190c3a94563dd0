"""Fix 9: a training stopped and resumed from its checkpoint ends where an uninterrupted one ends.

fairseq seeds every update (seed + num_updates), yet 0.12 keeps out of its checkpoints the float32 masters of
``--fp16``/``--bf16`` (rebuilt from the rounded model on resume), the dynamic loss scaler's counters (``--amp``: its
GradScaler's scale and growth tracker) and the plugin's modules' training state that is not a parameter (FLOATER's
solution reused between ``--pe-floater-refresh-updates`` refreshes: a module's ``training_state()`` /
``load_training_state(state)``, kept in the checkpoint's ``extra_state``, not in the model's state dict, and not
restored under ``--reset-optimizer``).  All three are saved and restored; checkpoints written before load as before.
The measurements behind it: docs/install.md (Fixes applied when the plugin is imported).

Extension points: none that fairseq 0.12 offers for the optimizer's or the trainer's checkpoint state (its
``FairseqOptimizer``/``Trainer`` classes are built by fairseq itself, not looked up in a registry): wrappers, once.
"""

import functools

from fairseq_pe.compat.patching import fairseq_matches, patch

#: fairseq releases whose checkpoints lack this state (the wrappers below rely on 0.12's FP16Optimizer layout and
#: Trainer.state_dict/load_checkpoint); another release gets a warning and fairseq's own behaviour
FIXES_FAIRSEQ = ("0.12.",)
#: every model's checkpoint keeps the masters and the scaler's counters (docs/install.md lists it)
CHANGES_STOCK = True
SUMMARY = "exact resume: checkpoints keep --fp16/--bf16's float32 masters, the loss scalers' state, FLOATER's solve"
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


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "exact_resume",
                           "a resumed --fp16/--bf16 or --pe-floater-refresh-updates training may differ from an "
                           "uninterrupted one"):
        return False
    from fairseq.optim.amp_optimizer import AMPOptimizer
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin, _MemoryEfficientFP16OptimizerMixin
    from fairseq.trainer import Trainer

    for mixin in (_FP16OptimizerMixin, _MemoryEfficientFP16OptimizerMixin):
        patch(mixin, "state_dict", _half_precision_state_saved)
        patch(mixin, "load_state_dict", _half_precision_state_loaded)
    patch(AMPOptimizer, "state_dict", _grad_scaler_state_saved)
    patch(AMPOptimizer, "load_state_dict", _grad_scaler_state_loaded)
    patch(Trainer, "state_dict", _training_state_saved)
    patch(Trainer, "load_checkpoint", _training_state_loaded)
    return True
