"""Instruments that observe a model from outside: nothing here is imported by a model, and nothing in a model calls
into it.

* :mod:`~fairseq_pe.diagnostics.attention_calls`: the backend each attention call takes and what it hands to torch's
  SDPA kernel (forward hooks on the attention modules, a wrapper of each one's planner for the block, and a
  ``TorchFunctionMode`` that sees SDPA's arguments);
* :mod:`~fairseq_pe.diagnostics.op_count`: the operators and host syncs of a step (a ``TorchDispatchMode``), taking
  CUDA's branches on the CPU through injected capabilities;
* :mod:`~fairseq_pe.diagnostics.capabilities`: capabilities that answer as on CUDA, injected into a model's attention
  modules for a block (:mod:`fairseq_pe.models.capabilities`);
* :mod:`~fairseq_pe.diagnostics.precision`: what half precision keeps of what positions change.
"""
