"""Capabilities that answer as on CUDA, injected into a model's attention modules for the length of a block.

A CPU tensor cannot pretend to be a CUDA tensor (:mod:`fairseq_pe.diagnostics.op_count`), so an instrument that
wants the operators or the SDPA arguments of a CUDA step on the CPU gives the model's attentions capabilities that
say "CUDA" (:class:`AsOnCuda`) through :func:`injected`: each attention holds them as its own attribute until the
block ends, and every other model of the process keeps the device's (:data:`fairseq_pe.models.capabilities.DEVICE`).
"""

import contextlib
from typing import Iterable, Optional

import torch.nn as nn

from fairseq_pe.models.attention import PositionAttention
from fairseq_pe.models.capabilities import PREDICATES, DeviceCapabilities


class AsOnCuda(DeviceCapabilities):
    """Every predicate named in ``only`` (all of :data:`~fairseq_pe.models.capabilities.PREDICATES` by default)
    answers as on CUDA, on any device; the others as the device's."""

    def __init__(self, only: Optional[Iterable[str]] = None):
        names = tuple(PREDICATES if only is None else only)
        unknown = set(names) - set(PREDICATES)
        if unknown:
            raise ValueError(f"not a device predicate: {sorted(unknown)} (fairseq_pe.models.capabilities.PREDICATES: "
                             f"{', '.join(PREDICATES)})")
        self.names = names
        for name in names:
            setattr(self, name, self._cuda)

    @staticmethod
    def _cuda(device) -> bool:
        return True


def attentions(*models: nn.Module):
    """The :class:`PositionAttention` modules of ``models`` (each may be an attention itself)."""
    return [m for model in models for m in model.modules() if isinstance(m, PositionAttention)]


@contextlib.contextmanager
def injected(capabilities: DeviceCapabilities, *models: nn.Module):
    """Within the block, the attentions of ``models`` plan and lay out their masks with ``capabilities``; each
    gets back what it held before at the end (blocks nest)."""
    saved = []
    try:
        for module in attentions(*models):
            saved.append((module, module.__dict__.get("capabilities")))
            module.capabilities = capabilities
        yield capabilities
    finally:
        for module, held in reversed(saved):
            if held is None:
                del module.capabilities
            else:
                module.capabilities = held


def as_on_cuda(*models: nn.Module, only: Optional[Iterable[str]] = None):
    """:func:`injected` with :class:`AsOnCuda`: the attentions of ``models`` take CUDA's branches in the block."""
    return injected(AsOnCuda(only), *models)
