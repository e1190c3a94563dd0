"""Issue 54's defects of the attention, one test each (the differential matrix, tests/test_differential_matrix.py,
covers the configurations): the backend decided from the module's state (gradients with activation checkpointing and
dropout against a finite difference), a pass that threads cannot mix (with an owner check), the pass's memo holding
O(T + S) values only, no T × T allocation in long evaluation with right padding, and step-by-step decoding of a
left-padded decoder (positions read from every key's padding; no NaN row)."""

import threading

import pytest
import torch

import fairseq_pe.models.attention as attention_module
from fairseq_pe import systems as catalogue
from fairseq_pe.positional.pass_state import PassOwnerError, pass_scope

from helpers import build_model, largest_tensor_created, random_tokens
from passes import recorded_passes
from test_differential_matrix import NAMES, Case, batch, build

TINY = ["--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2"]


def flags_of(name):
    """The catalogue's flags of ``name``, Shaw's distances clipped at 4 (the tests' sentences go past them)."""
    return catalogue.flags(name) + (["--pe-relative-max-distance", "4"] if name.startswith("rpe") else [])


def encoder_loss(model, src, lengths, weights, seed=7):
    """A seeded loss of the encoder's outputs (the same dropout draws at every call)."""
    torch.manual_seed(seed)
    out = model.encoder(src, lengths)["encoder_out"][0]
    return (out * weights).sum()


@pytest.mark.parametrize("name", ["alibi", "t5", "rpe-learned", "fox"])  # sdpa, and blockwise three ways
def test_checkpointed_gradients_with_attention_dropout_are_the_losss(name, monkeypatch):
    """Defect 1: with --checkpoint-activations and attention dropout, the gradient is the derivative of the loss
    the forward computed: the directional derivative equals a central finite difference of the seeded loss (float64).
    The blocks threshold is lowered so that evaluation-sized masks are 'large' here: a backend read from the grad
    mode took blocks in the checkpointed forward (no autograd) and another one in the recomputation."""
    monkeypatch.setattr(attention_module, "AUTO_BLOCKS_ELEMENTS", 1)
    model, d = build_model(*flags_of(name), *TINY, "--checkpoint-activations", "--dropout", "0",
                           "--attention-dropout", "0.3")
    model.double().train()
    src = random_tokens(d, 3, 9, left_pad=(0, 3, 5))
    lengths = src.ne(d.pad()).sum(1)
    weights = torch.randn(9, 3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    params = [p for p in model.encoder.parameters() if p.requires_grad]
    direction = [torch.randn_like(p) for p in params]
    model.zero_grad()
    encoder_loss(model, src, lengths, weights).backward()
    analytic = sum((p.grad * v).sum() for p, v in zip(params, direction) if p.grad is not None).item()
    eps = 1e-5  # small against the ReLUs' kinks; the float32 islands of some encodings round the difference (5e-3)
    with torch.no_grad():
        for sign in (1, -1):
            for p, v in zip(params, direction):
                p.add_(sign * eps * v)
            if sign == 1:
                plus = encoder_loss(model, src, lengths, weights).item()
            else:
                for p, v in zip(params, direction):
                    p.add_(-eps * v)
                minus = encoder_loss(model, src, lengths, weights).item()
                for p, v in zip(params, direction):
                    p.add_(eps * v)
    numeric = (plus - minus) / (2 * eps)
    assert abs(analytic - numeric) <= 5e-3 * max(1.0, abs(numeric)), (analytic, numeric)


def serial_and_threaded(models, inputs, pad, rounds=20, grad=False):
    """Each (model, input) evaluated alone, and all of them at once in threads, ``rounds`` times each (``grad``:
    with autograd on, as a training pass records)."""

    def run(model, src):
        with torch.set_grad_enabled(grad):
            return model.encoder(src, src.ne(pad).sum(1))["encoder_out"][0].detach().clone()

    serial = [run(m, x) for m, x in zip(models, inputs)]
    results, errors = [[] for _ in models], []
    start = threading.Barrier(len(models))

    def worker(i):
        try:
            start.wait()
            for _ in range(rounds):
                results[i].append(run(models[i], inputs[i]))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(models))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return serial, results


def test_two_models_and_one_model_evaluated_in_threads_give_their_serial_outputs():
    """Defect 2: the pass is per thread; two T5 models in two threads, and one model in two threads with inputs of
    different shapes, give exactly their serial outputs (before: 0.12 and 0.24 away, or a shape error)."""
    torch.set_num_threads(1)
    first, d = build_model(*catalogue.flags("t5"), *TINY, seed=0)
    second, _ = build_model(*catalogue.flags("t5"), *TINY, seed=1)
    short, long = random_tokens(d, 2, 64, left_pad=(0, 5)), random_tokens(d, 3, 96, seed=1, left_pad=(0, 7, 2))
    for models, inputs in (((first, second), (short, short)), ((first, first), (short, long))):
        serial, threaded = serial_and_threaded(models, inputs, d.pad())
        for want, runs in zip(serial, threaded):
            for got in runs:
                torch.testing.assert_close(got, want, rtol=0, atol=0)


#: with autograd on, the systems whose per-pass state differs from evaluation's (FLOATER's solve of the pass, per
#: thread, against evaluation's cached solution), and one bias and one rotation: the pass itself is the same
WITH_GRAD = ("floater", "floater-bias", "t5", "rope")


@pytest.mark.parametrize("name, grad", [(name, False) for name in NAMES] + [(name, True) for name in WITH_GRAD],
                         ids=[*NAMES, *(f"{name}-grad" for name in WITH_GRAD)])
def test_every_system_in_two_threads_gives_its_serial_outputs(name, grad):
    """One model of each system of the catalogue, in two threads with inputs of different lengths and padding,
    gives exactly its serial outputs, without autograd (evaluation: FLOATER's cached solution) and with it (a
    training pass: FLOATER's solve of the pass, per thread)."""
    torch.set_num_threads(1)
    model, d = build(name, "encoder")
    short, long = random_tokens(d, 2, 6, left_pad=(0, 2)), random_tokens(d, 3, 11, seed=1, left_pad=(0, 3, 1))
    serial, threaded = serial_and_threaded((model, model), (short, long), d.pad(), rounds=3, grad=grad)
    for want, runs in zip(serial, threaded):
        for got in runs:
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_an_attention_refuses_a_pass_of_another_model():
    """The owner check: a layer of one model called within another model's pass fails loudly, naming it."""
    first, d = build_model(*catalogue.flags("alibi"), *TINY, seed=0)
    second, _ = build_model(*catalogue.flags("alibi"), *TINY, seed=1)
    src = random_tokens(d, 2, 6)
    x = torch.randn(6, 2, 16)
    with pass_scope(first.encoder.embed_positions.build_pass(src)):
        first.encoder.layers[0].self_attn(x, x, x, need_weights=False)  # its own pass: fine
        with pytest.raises(PassOwnerError, match="another side or model"):
            second.encoder.layers[0].self_attn(x, x, x, need_weights=False)


@pytest.mark.parametrize("name", ["fox", "alibi-dape", "t5", "rpe-learned"])
def test_the_memo_keeps_no_t_by_s_tensor_while_a_blockwise_forward_records(name, monkeypatch):
    """Defect 5: in blockwise training (blocks of 8 query rows, each checkpointed), what the pass keeps after the
    forward is O(T + S): no block's mask or bias (before: FoX 1.0·T², ALiBi + DAPE 5.07·T²)."""
    monkeypatch.setattr(attention_module, "BLOCK_ELEMENTS", 8 * 2 * 2 * 64)
    model, d = build_model(*flags_of(name), *TINY, "--dropout", "0", "--attention-dropout", "0")
    model.train()
    src = random_tokens(d, 2, 64)
    with recorded_passes(model.encoder.embed_positions) as passes:
        out = model.encoder(src, src.ne(d.pad()).sum(1))["encoder_out"][0]
    kept = sum(t.numel() for p in passes for t in p.memo.tensors())
    assert kept < 64 * 64, f"{name}: the memo keeps {kept} elements after the forward (T·S = {64 * 64})"
    out.sum().backward()


def test_long_evaluation_with_right_padding_allocates_no_t_by_t_mask(monkeypatch):
    """A right-padded RoPE language model in evaluation above the blocks threshold: no allocation of B·T·T (before,
    with whole_mask answering False: 524,288 elements, the whole merged mask)."""
    monkeypatch.setattr(attention_module, "AUTO_BLOCKS_ELEMENTS", 1 << 14)
    monkeypatch.setattr(attention_module, "EVAL_BLOCK_ELEMENTS", 1 << 12)
    model, d = build("rope", "lm")
    rows = [torch.randint(d.nspecial, len(d), (n,), generator=torch.Generator().manual_seed(n)) for n in (256, 200)]
    tokens, _ = batch(d, rows, "right")
    with torch.no_grad():
        _, largest = largest_tensor_created(lambda: model(tokens))
    # the largest is the future mask's stand-in, a view of one element with T × T's shape (numel 65,536)
    assert largest < 2 * 256 * 256, largest


@pytest.mark.parametrize("name", ["fope", "rope-rerope", "fire", "ape-sinusoidal", "ape-learned"])
def test_step_by_step_decoding_of_a_left_padded_language_model_is_its_full_pass(name):
    """Defects 4 and 7: a left-padded row decoded step by step gives the full pass's log-probs at its real tokens,
    with no NaN: the encodings that need positions read every key's padding (fairseq hands no mask once the new token
    is real; before: FoPE 9.9e-2, ReRoPE 8.2e-2 apart), and an all-padding row of an absolute-only model is the
    plugin's (0, never NaN), as in its full pass."""
    case = Case(name, "lm")
    case.step_by_step(torch.float64, "left")
