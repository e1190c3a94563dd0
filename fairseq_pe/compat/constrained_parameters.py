"""Fix 7: position parameters with a range stay in it, in the copy the optimizer updates (projected gradient).

KERPLE's r₁, r₂ > 0 (Chi et al., NeurIPS 2022, eq. 5-6; :func:`fairseq_pe.positional.base.constrain`) are kept in
their range by projection after every step, as the KERPLE reference does (chijames/KERPLE clamps ``.data`` to
``min=1e-2`` before each use): the parameter itself (plain optimizers, ``--memory-efficient-fp16``/``-bf16``,
``--amp``, BMUF: torch's optimizer step post-hook, an extension point), or ``--fp16``/``--bf16``'s float32 master,
which fairseq copies over the model after each step.

Extension points: torch's ``register_optimizer_step_post_hook`` for the parameters themselves.  The masters keep
a wrapper of ``_FP16OptimizerMixin._sync_fp32_params_to_fp16``: fairseq 0.12 builds them (one flat buffer) with no
hook and no link back to the model's parameters, and only that copy into the model reads both.
"""

import functools
import weakref

from fairseq_pe.compat.patching import add_hook, fairseq_matches, patch

#: the fairseq releases this fix is written for (the masters' flat layout is 0.12's FP16Optimizer's)
FIXES_FAIRSEQ = ("0.12.",)
#: only parameters marked by ``constrain`` are touched: stock models train as they do
CHANGES_STOCK = False
SUMMARY = "parameters with a range (KERPLE's r1, r2) are projected into it after each optimizer step"

#: torch optimizer -> its constrained (tensor, bounds), found at its first step (fairseq never changes the groups)
_constrained_of = weakref.WeakKeyDictionary()


def _constrained(params):
    """(tensor, bounds) of the parameters marked by :func:`fairseq_pe.positional.base.constrain`."""
    return [(p.data, p.pe_bounds) for p in params if getattr(p, "pe_bounds", None) is not None]


def _project_after_step(optimizer, args, kwargs):
    """torch's optimizer step post-hook: project the constrained parameters ``optimizer`` has just updated."""
    from fairseq_pe.positional.base import project_

    constrained = _constrained_of.get(optimizer)
    if constrained is None:
        constrained = _constrained_of[optimizer] = _constrained(
            p for group in optimizer.param_groups for p in group["params"])
    for tensor, bounds in constrained:
        project_(tensor, bounds)


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


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "constrained_parameters",
                           "--fp16/--bf16's float32 masters of KERPLE's r1, r2 may leave their range"):
        return False
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    add_hook(register_optimizer_step_post_hook, _project_after_step)
    patch(_FP16OptimizerMixin, "_sync_fp32_params_to_fp16", _masters_projected)
    return True
