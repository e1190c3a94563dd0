"""What a training step or a decoding step asks of the device: the operators it runs and the host syncs it makes.

On a GPU a step is bound by kernel launches and by the points where the host waits for the device (``.item()``,
``int()``/``bool()``/``float()`` of a tensor, an operation whose output size depends on the data).  The CPU runs the
same operators, so they are counted here, on any device: :func:`counting` records every operator that reaches
torch's kernels (a ``TorchDispatchMode``: below autograd, so the backward pass's operators count too, each once),
and which of them make the host wait (:data:`SYNC_OPS`).  ``scripts/count_ops.py`` reports them per encoding against
stock fairseq; ``tests/test_host_syncs.py`` holds the targets.
"""

import contextlib
from collections import Counter
from dataclasses import dataclass, field

#: operators after which the host has a tensor's value (or a data-dependent size): a sync on a GPU
SYNC_OPS = {"_local_scalar_dense", "equal", "is_nonzero", "nonzero", "nonzero_static", "masked_select", "_unique2",
            "unique_consecutive", "unique_dim", "repeat_interleave"}


@dataclass
class OpCount:
    ops: Counter = field(default_factory=Counter)
    #: the operators among ``ops`` that return a view of their input (no kernel runs: ``view``, ``permute`` ...)
    views: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def kernels(self) -> int:
        """Operators that are not views: those that launch a kernel on a GPU."""
        return self.total - sum(self.views.values())

    @property
    def syncs(self) -> int:
        return sum(n for op, n in self.ops.items() if op in SYNC_OPS)

    def sync_ops(self):
        return {op: n for op, n in self.ops.items() if op in SYNC_OPS}


@contextlib.contextmanager
def counting():
    """Within the block, every operator dispatched to torch's kernels is counted in the :class:`OpCount` yielded
    (by its name without overload: ``addmm``, ``_local_scalar_dense`` ...)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    result = OpCount()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            result.ops[name] += 1
            if func.is_view:
                result.views[name] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        yield result
