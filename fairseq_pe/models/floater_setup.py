"""Wiring FLOATER (:mod:`fairseq_pe.positional.floater`) into a model.

A model that uses FLOATER (``--pe-absolute floater`` or ``--pe-floater-bias``) owns one
:class:`~fairseq_pe.positional.floater.FloaterFlow` (``model.floater``); the FLOATER users of
its encoder and decoder (absolute encodings, Q/K/V-bias initial values) become its clients,
grouped as in the official code: one dynamics network for the encoder, one for the decoder's
self-attention, one for cross-attention.  The model's ``forward`` opens one
``forward_pass`` so that a single solve serves the encoder and the decoder.
"""

import contextlib
from typing import Dict, Optional

from fairseq_pe.positional.floater import FloaterFlow, FloaterPositionEncoding, uses_floater


def build_floater_flow(args, injectors: Dict[str, object]) -> Optional[FloaterFlow]:
    """``injectors``: side name ("encoder", "decoder") -> that side's PositionInjector."""
    if not uses_floater(args):
        return None
    clients = []  # (group, client): a side's absolute encoding and self-attention biases share its network
    for side, injector in injectors.items():
        if isinstance(injector.absolute, FloaterPositionEncoding):
            clients.append((side, injector.absolute))
        if injector.self_bias is not None:
            clients.append((side, injector.self_bias))
        if injector.cross_bias is not None:
            clients.append(("cross", injector.cross_bias))
    dims = {client.embed_dim for _, client in clients}
    if len(dims) > 1:
        raise ValueError(f"FLOATER needs the same embedding dimension on every side (got {sorted(dims)}): one "
                         "ODE state serves them all; set --encoder-embed-dim and --decoder-embed-dim equal")
    flow = FloaterFlow(dims.pop(), args)
    for group, client in clients:
        flow.add_client(group, client)
    return flow.build_dynamics()


def apply_floater_freezing(model, flow: Optional[FloaterFlow], args):
    """``--pe-floater-freeze-body`` / ``--pe-floater-freeze-dynamics`` (paper §4.4)."""
    if flow is None:
        return
    if getattr(args, "pe_floater_freeze_body", False):
        keep = {id(p) for p in flow.floater_parameters()}
        for p in model.parameters():
            if id(p) not in keep:
                p.requires_grad_(False)
    if getattr(args, "pe_floater_freeze_dynamics", False):
        for p in flow.dynamics.parameters():
            p.requires_grad_(False)


def flow_of(injector) -> Optional[FloaterFlow]:
    """The FloaterFlow serving the encodings of ``injector`` (a PositionInjector), if any; None for
    other position modules (fairseq's own)."""
    for name in ("absolute", "self_bias", "cross_bias"):
        flow = getattr(getattr(injector, name, None), "flow", None)
        if flow is not None:
            return flow
    return None


def floater_pass(flow: Optional[FloaterFlow], length: int):
    """``flow.forward_pass(length)``, or nothing for a model without FLOATER."""
    return flow.forward_pass(length) if flow is not None else contextlib.nullcontext()
