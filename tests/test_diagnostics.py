"""The instruments of ``fairseq_pe/diagnostics/`` observe from outside (issue 54): no model module imports them,
recording leaves a model as it was and computes the same numbers, and what it records is what the planner chose.

Mutations caught: an import of the diagnostics from a model module (the import scan); a hook or the planner's
wrapper left on the model (``test_recording_leaves_the_model_as_it_was``); the records taken from anything but the
planner's choice and SDPA's own arguments (``test_recording_sees_each_backend``: blocks' SDPA calls, one per
block, each with its rows' mask)."""

import ast
import os

import torch

from fairseq_pe.diagnostics.attention_calls import recording
from fairseq_pe.models import attention as attention_module
from fairseq_pe.models.attention import PositionAttention

from helpers import REPO, build_model, random_tokens


def test_no_model_module_imports_the_diagnostics():
    package = os.path.join(REPO, "fairseq_pe")
    importers = []
    for root, _, files in os.walk(package):
        for name in files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, REPO)
            if not name.endswith(".py") or relative.startswith(os.path.join("fairseq_pe", "diagnostics")):
                continue
            if relative.startswith(os.path.join("fairseq_pe", "benchmark")):
                continue  # the measurements and the GPU check, which observe models through the instruments
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                if any(m == "fairseq_pe.diagnostics" or m.startswith("fairseq_pe.diagnostics.") for m in modules) \
                        or (isinstance(node, ast.ImportFrom) and node.level and "diagnostics" in
                            [node.module, *[a.name for a in node.names]]):
                    importers.append(f"{relative}:{node.lineno}")
    assert not importers, f"the package's own modules import the instruments: {importers}"
    assert not hasattr(attention_module, "observing") and not hasattr(attention_module, "_observer")


def encoder_outputs(model, src, lengths):
    with torch.no_grad():
        return model.encoder(src, lengths)["encoder_out"][0]


def test_recording_leaves_the_model_as_it_was():
    model, d = build_model("--pe-relative", "t5", "--dropout", "0")
    model.eval()
    src = random_tokens(d, 3, 9, left_pad=(0, 2, 4))
    lengths = src.ne(d.pad()).sum(1)
    expected = encoder_outputs(model, src, lengths)
    with recording(model) as calls:
        inside = encoder_outputs(model, src, lengths)
    assert calls and torch.equal(inside, expected)
    for module in model.modules():
        if isinstance(module, PositionAttention):
            assert "plan" not in module.__dict__
            assert not module._forward_hooks and not module._forward_pre_hooks
    assert torch.equal(encoder_outputs(model, src, lengths), expected)


def test_recording_sees_each_backend(monkeypatch):
    """The path of each call is the planner's choice, and the ``blocks`` backend's SDPA calls are recorded one per
    block, each with its rows' mask."""
    monkeypatch.setattr(attention_module, "EVAL_VIEW_BLOCK_ROWS", 2)  # 2 query rows per block
    model, d = build_model("--pe-relative", "t5", "--dropout", "0", "--encoder-layers", "1")
    model.eval()
    layer = model.encoder.layers[0].self_attn
    src = random_tokens(d, 1, 7)
    lengths = torch.tensor([7])
    chosen = {}
    for kernel in ("sdpa", "blockwise", "explicit", "flex"):
        layer.kernel = kernel
        with recording(model) as calls:
            encoder_outputs(model, src, lengths)
        chosen[kernel] = calls
    assert [c.path for c in chosen["sdpa"]] == ["fused"] and chosen["sdpa"][0].mask_shape == (1, 4, 7, 7)
    blocks = chosen["blockwise"]  # evaluation: SDPA over blocks of query rows
    assert [c.path for c in blocks] == ["blocks"] * 4
    assert [c.mask_shape[2] for c in blocks] == [2, 2, 2, 1]
    assert [c.path for c in chosen["explicit"]] == ["explicit"]
    assert [c.path for c in chosen["flex"]] == ["flex"]
    model.train()
    layer.kernel = "auto"
    with recording(model) as calls:  # a learned bias's gradient on the CPU: explicit blocks
        model.encoder(src, lengths)
    assert [c.path for c in calls] == ["blockwise"]
