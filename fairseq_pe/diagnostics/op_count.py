"""What a training step or a decoding step asks of the device: the operators it runs and the host syncs it makes.

On a GPU a step is bound by kernel launches and by the points where the host waits for the device.  The CPU runs the
same operators, so they are counted here, on any device: :func:`counting` records every operator that reaches
torch's kernels (a ``TorchDispatchMode``: below autograd, so the backward pass's operators count too, each once),
and which of those calls make the host wait.  ``fairseq-pe-count-ops`` reports them per encoding against stock
fairseq; ``tests/test_host_syncs.py`` holds the targets.

What counts as a sync, and how a count on the CPU sees what only a GPU would do:

* **operators that hand the host a value or a data-dependent size** (:data:`SYNC_OPS`): ``.item()``,
  ``int()``/``bool()``/``float()`` of a tensor (``_local_scalar_dense``), ``torch.equal``, ``allclose``,
  ``nonzero`` (and ``torch.where(c)``, ``argwhere``), ``masked_select``, ``unique``, ``bincount``, a
  ``repeat_interleave`` of tensor counts, linear algebra's error checks;
* **indexing with a boolean mask** (``x[mask]``, ``x[mask] = v``): torch's ``index``/``index_put_`` turn the mask
  into indices with ``nonzero`` inside the kernel, below this mode, so the call is recognised by the dtype of its
  indices (:func:`masked_indexing`).  ``x[mask] = scalar`` is not one: torch runs it as ``masked_fill_``, on CUDA
  too (``canDispatchToMaskedFill`` in ATen's ``TensorAdvancedIndexing.cpp``: a one-element value on the host);
* **copies between the host and a device** (``_to_copy``/``copy_`` whose input and output devices differ, one of
  them the CPU): to the host always; to a device unless ``non_blocking`` (torch synchronises the stream after a
  blocking copy in either direction).  These are seen where tensors live on a device (a GPU; FakeTensorMode's
  pretend CUDA tensors in the tests);
* **reads by the host of a tensor that the CPU holds** (:data:`HOST_READS`): on the CPU, ``x.cpu()``,
  ``x.to("cpu")``, ``x.tolist()`` and ``x.numpy()`` dispatch nothing (the tensor is already there), so a dispatch
  mode cannot see them.  A ``TorchFunctionMode`` counts them, one each, as the device-to-host copy they are when
  ``x`` is a device tensor: in a counted step every tensor is the model's or the batch's, which a GPU run keeps on
  the GPU.  ``.to()`` counts only where it names the host as the string ``"cpu"``: device-generic code passes a
  ``torch.device`` (``x.to(y.device)``; fairseq's gradient norm moves every norm to ``torch.device("cpu")`` in its
  CPU-only branch, to the current CUDA device in its CUDA branch), which is no copy on a GPU either.

**CUDA-only branches.** A CPU tensor cannot pretend to be a CUDA tensor: torch initialises CUDA for a factory
given ``device="cuda"``, and the autograd engine needs CUDA's device guard for a tensor that reports CUDA (a wrapper
subclass does, and then ``backward`` aborts the process on a CPU-only build); the meta device has no values, so a
fairseq training step (its loss, its gradient norm) cannot run on it.  The package therefore takes every decision on
the device type through an attention's capabilities (:mod:`fairseq_pe.models.capabilities`), and :func:`counting`
injects capabilities that answer as on CUDA into the models it is given, for its block
(:func:`fairseq_pe.diagnostics.capabilities.as_on_cuda`), as ``fairseq-pe-sdpa-arguments`` and
``tests/test_kernel_choices.py`` simulate CUDA's kernel choices: the counted steps take CUDA's branches (masks laid
out for the memory-efficient kernel, a bias with a gradient on the fused path).  ``tests/test_host_syncs.py`` checks
that every branch on the device type in ``fairseq_pe/`` is one of those capabilities or outside the training and
decoding steps.

Not seen on the CPU: host-to-device copies of tensors made on the host (``torch.tensor(data, device=d)``), a
``copy_`` from a device tensor into a CPU buffer, and syncs inside an operator other than those above.
``_local_scalar_dense`` of a tensor that a GPU run would keep on the host (fairseq's encoder builds its padding test
from ``torch.tensor(False)``) counts as a sync: the count errs towards syncs, the same for every system.
"""

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch

from fairseq_pe.diagnostics import capabilities

#: operators after which the host has a tensor's value (or a data-dependent size): a sync on a GPU
SYNC_OPS = {"_local_scalar_dense", "equal", "allclose", "is_nonzero", "nonzero", "nonzero_static", "masked_select",
            "_unique", "_unique2", "unique_consecutive", "unique_dim", "unique_dim_consecutive", "bincount",
            "repeat_interleave", "_linalg_check_errors"}
#: operators whose tensor indices may be a boolean mask (turned into indices by ``nonzero`` in the kernel)
INDEXING_OPS = {"index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"}
#: operators that copy between devices when their input and output devices differ
COPY_OPS = {"_to_copy", "copy_", "copy"}
#: the names of the Tensor methods that read a CPU tensor on the host without dispatching anything
HOST_READ_NAMES = ("cpu", "tolist", "numpy", "__array__")


@dataclass
class OpCount:
    ops: Counter = field(default_factory=Counter)
    #: the operators among ``ops`` that return a view of their input (no kernel runs: ``view``, ``permute`` ...)
    views: Counter = field(default_factory=Counter)
    #: the calls among ``ops`` that make the host wait, by kind (``nonzero``, ``index (mask)``, ``_to_copy (to host)``)
    sync_calls: Counter = field(default_factory=Counter)
    #: reads of CPU tensors by the host that dispatch nothing (``Tensor.cpu``, ``Tensor.tolist`` ...): device-to-host
    #: copies where the tensor is on a device (module docstring)
    host_reads: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def kernels(self) -> int:
        """Operators that are not views: those that launch a kernel on a GPU."""
        return self.total - sum(self.views.values())

    @property
    def syncs(self) -> int:
        return sum(self.sync_calls.values()) + sum(self.host_reads.values())

    def sync_ops(self):
        return {**self.sync_calls, **self.host_reads}


def _device(value):
    return getattr(value, "device", None)


def masked_indexing(name, args, kwargs) -> bool:
    """Whether an indexing operator's indices include a boolean mask (module docstring)."""
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    if not any(getattr(i, "dtype", None) in (torch.bool, torch.uint8) for i in indices or ()):
        return False
    if name.startswith(("index_put", "_index_put", "_unsafe_index_put")):
        values = args[2] if len(args) > 2 else kwargs.get("values")
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        if not accumulate and values is not None and values.numel() == 1 and values.device.type == "cpu":
            return False  # torch's masked_fill_ path (a value on the host: a Python scalar)
    return True


def copy_direction(name, args, kwargs):
    """"to host" or "to device" for a copy between the CPU and a device that makes the host wait, else None."""
    if name == "_to_copy":
        source, target = _device(args[0]), kwargs.get("device") or _device(args[0])
    else:  # copy_(self, src) / copy(self, src): into self
        source, target = _device(args[1]), _device(args[0])
        kwargs = {"non_blocking": args[2] if len(args) > 2 else kwargs.get("non_blocking", False)}
    if source is None or target is None or source.type == target.type or "meta" in (source.type, target.type):
        return None
    if target.type == "cpu":
        return "to host"
    if source.type == "cpu" and not kwargs.get("non_blocking", False):
        return "to device"
    return None


def _names_the_host(args, kwargs) -> bool:
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, str) and target.split(":")[0] == "cpu"


@contextlib.contextmanager
def counting(*models, as_on_cuda: bool = True):
    """Within the block, every operator dispatched to torch's kernels is counted in the :class:`OpCount` yielded
    (by its name without overload: ``addmm``, ``_local_scalar_dense`` ...), with the calls that make the host wait
    (module docstring); with ``as_on_cuda`` the attentions of ``models`` take CUDA's branches
    (:func:`~fairseq_pe.diagnostics.capabilities.as_on_cuda`)."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    result = OpCount()
    host_reads = {getattr(torch.Tensor, name) for name in HOST_READ_NAMES}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            result.ops[name] += 1
            if func.is_view:
                result.views[name] += 1
            if name in SYNC_OPS:
                if name != "repeat_interleave" or kwargs.get("output_size") is None:
                    result.sync_calls[name] += 1
            elif name in INDEXING_OPS:
                if masked_indexing(name, args, kwargs):
                    result.sync_calls[f"{name} (mask)"] += 1
            elif name in COPY_OPS:
                direction = copy_direction(name, args, kwargs)
                if direction is not None:
                    result.sync_calls[f"{name} ({direction})"] += 1
            return func(*args, **kwargs)

    class HostReads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", None)
            if (name in HOST_READ_NAMES and func in host_reads) or (func is torch.Tensor.to
                                                                     and _names_the_host(args, kwargs)):
                if isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu":  # a device's: dispatched
                    result.host_reads[f"Tensor.{name}"] += 1
            return func(*args, **kwargs)

    with contextlib.ExitStack() as stack:
        if as_on_cuda:
            stack.enter_context(capabilities.as_on_cuda(*models))
        stack.enter_context(HostReads())
        stack.enter_context(Count())
        yield result
