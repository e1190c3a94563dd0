"""Fix 8: ``--ddp-backend legacy_ddp`` reduces each dtype's gradients in a buffer of that dtype.

fairseq 0.12's one flat buffer takes the dtype of the model's first parameter, so under ``--fp16``/``--bf16`` the
float32 position parameters' gradients went through half precision.  A model of one dtype (every stock model)
is reduced exactly as fairseq does.

Extension point: none; DDP communication hooks are torch DDP's, and ``LegacyDistributedDataParallel`` has no
hook of its own (a wrapper, once).
"""

import functools

from fairseq_pe.compat.patching import fairseq_matches, patch

#: the fairseq releases this fix is written for
FIXES_FAIRSEQ = ("0.12.",)
#: it changes stock fairseq's behaviour for every task of the process (docs/install.md lists it)
CHANGES_STOCK = False
SUMMARY = "legacy_ddp reduces each dtype's gradients in a buffer of that dtype"


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


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "legacy_ddp_dtypes",
                           "float32 gradients of a half-precision model are reduced in half precision"):
        return False
    from fairseq.distributed import LegacyDistributedDataParallel

    patch(LegacyDistributedDataParallel, "all_reduce_grads", _reduced_per_dtype)
    return True
