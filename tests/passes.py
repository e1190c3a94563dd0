"""What tests read of a pass (:mod:`fairseq_pe.positional.pass_state`): the passes a side builds, and the tensors that
modules still reference after one."""

import contextlib

import torch
import torch.nn as nn
from fairseq.models.transformer import TransformerDecoderBase

from fairseq_pe.positional.floater import FloaterFlow


@contextlib.contextmanager
def recorded_passes(injector):
    """Within the block, every pass that ``injector`` (a side's PositionInjector) builds is appended to the list
    yielded (the positions a test reads; nothing of it is kept on the model)."""
    passes = []
    build = injector.build_pass

    def recording(*args, **kwargs):
        passes.append(build(*args, **kwargs))
        return passes[-1]

    injector.build_pass = recording
    try:
        yield passes
    finally:
        del injector.build_pass


#: tensors that are a cache of the parameters or of sizes, not of a pass: FLOATER's solution in evaluation (keyed
#: on the parameters' versions, extended as longer inputs come) and its refreshed solution
#: (--pe-floater-refresh-updates); stock fairseq's decoder's future mask (-inf above the diagonal, grown as needed)
CACHES = ((FloaterFlow, "_cache"), (FloaterFlow, "_refresh"), (TransformerDecoderBase, "_future_mask"))


def _tensors_in(value, path, seen, found, depth=0):
    """Append (path, tensor) for every tensor reachable from ``value`` through containers and plain objects, not
    through modules (each module is walked on its own) or parameters."""
    if id(value) in seen or depth > 8:
        return
    seen.add(id(value))
    if isinstance(value, nn.Module):
        return
    if torch.is_tensor(value):
        found.append((path, value))
    elif isinstance(value, dict):
        for key, item in list(value.items()):
            _tensors_in(key, f"{path}[{key!r}]", seen, found, depth + 1)
            _tensors_in(item, f"{path}[{key!r}]", seen, found, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for i, item in enumerate(value):
            _tensors_in(item, f"{path}[{i}]", seen, found, depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, type) and not callable(getattr(value, "__func__", None)):
        _tensors_in(vars(value), f"{path}.", seen, found, depth + 1)
    if hasattr(value, "__slots__") and not torch.is_tensor(value):
        for slot in value.__slots__ if isinstance(value.__slots__, (tuple, list)) else (value.__slots__,):
            if hasattr(value, slot):
                _tensors_in(getattr(value, slot), f"{path}.{slot}", seen, found, depth + 1)


def leftover_tensors(model):
    """``name.attribute -> size in bytes`` of every tensor that a module of ``model`` references beyond its
    registered parameters and buffers (hooks and plain objects included)."""
    registered = {id(t) for t in list(model.parameters()) + list(model.buffers())}
    leftovers = {}
    for name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if attribute in ("_parameters", "_buffers", "_modules") or any(
                    isinstance(module, owner) and attribute == name for owner, name in CACHES):
                continue
            found = []
            _tensors_in(value, f"{name or 'model'}.{attribute}", set(), found)
            for path, tensor in found:
                if id(tensor) not in registered and tensor.numel() > 0:
                    leftovers[path] = tensor.numel() * tensor.element_size()
    return leftovers


