"""Checkpoints written before the package was regrouped (fairseq-pe 0.1.0 at bfc38f4: translation/,
bert/, warm_start/, analysis/cli.py) load with today's code and compute what they computed then.

A checkpoint names fairseq_pe's classes only through fairseq's registries (``--arch``, ``--task``), never
by module path, so a move must not break it; tests/fixtures/checkpoints-0.1/make.py wrote them and the
outputs they are compared with."""

import os

import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_pe  # noqa: F401  (registers the models)

from helpers import FIXTURES

OLD = os.path.join(FIXTURES, "checkpoints-0.1")


def load(folder, **overrides):
    (model,), _ = checkpoint_utils.load_model_ensemble([os.path.join(folder, "checkpoint.pt")],
                                                       arg_overrides={"data": folder, **overrides})
    return model.eval(), torch.load(os.path.join(folder, "expected.pt"))


def test_a_translation_checkpoint_from_before_the_move_loads_and_computes_the_same():
    model, expected = load(os.path.join(OLD, "translation"), source_lang="src", target_lang="tgt")
    assert type(model).__name__ == "TransformerPEModel" and model.floater is not None
    src = expected["src_tokens"]
    with torch.no_grad():
        out = model(src, torch.full((src.size(0),), src.size(1)), expected["prev_output_tokens"])
        log_probs = model.get_normalized_probs(out, log_probs=True)
    # to float32 rounding: the CPU's attention kernel may sum in another order (1.4e-6 of 7.6 seen on one CPU)
    torch.testing.assert_close(log_probs, expected["log_probs"], rtol=1e-6, atol=1e-6)


def test_a_roberta_checkpoint_from_before_the_move_loads_and_computes_the_same():
    model, expected = load(os.path.join(OLD, "roberta"))
    assert type(model).__name__ == "RobertaPEModel"
    with torch.no_grad():
        logits = model(expected["src_tokens"])[0]
    torch.testing.assert_close(logits, expected["logits"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["translation", "roberta"])
def test_fairseq_pe_analyze_reads_them(kind):
    from fairseq_pe.analysis import load_checkpoint
    loaded = load_checkpoint(os.path.join(OLD, kind, "checkpoint.pt"))
    assert loaded.family == kind
