"""A float64 model runs every system of the catalogue in float64, and equals the float32 model with its weights.

float64 is the reference of differential tests: the float32 islands that serve fp16/bf16 (position parameters kept
float32 by :class:`~fairseq_pe.positional.base.Float32State`, biases, gates and rotations computed in float32,
:func:`~fairseq_pe.positional.base.compute_dtype`) must neither crash against float64 parameters nor round a float64
model's values to float32.  Each system runs in a tiny ``transformer_pe`` (the encoder's bidirectional and the
decoder's causal self-attention; every system of the catalogue is encoder-capable), right-padded, in evaluation
without autograd and in training (dropout 0) with a backward.
"""

import copy
import re
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from fairseq_pe import systems as catalogue

from helpers import TEST_SIZES, build_model, random_tokens

#: embed 16, 2 heads, 2 layers a side (the tiny architecture's), FFN 32
TINY = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
        "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--dropout", "0", "--attention-dropout", "0"]
#: every system of the catalogue (a warm start's flags are another system's)
SYSTEMS = {name: list(s.flags) + TEST_SIZES.get(name, []) for name, s in catalogue.SYSTEMS.items()
           if s.warm_start is None}
#: float32 against float64 with the same weights: float32's rounding through two layers a side
TOLERANCE = 1e-4
LOWER = (torch.float32, torch.float16, torch.bfloat16, torch.complex64)
#: functions whose float32 is not a position encoding's: the attention's softmax, the plugin's and fairseq's own
#: (``fairseq.utils.softmax``), which are float32 whatever the model's dtype
NOT_ENCODINGS = ("safe_softmax", "softmax")
#: a file of the plugin's package or of fairseq's (not of the tests, whatever the checkout's folder is called)
PACKAGE_FILE = re.compile(r"[/\\](fairseq_pe|fairseq)[/\\](?!tests[/\\])")


class Downcasts(TorchDispatchMode):
    """Records every operation that reads a float64 (complex128) tensor and returns one of lower precision, by the
    line of the plugin (or of fairseq) that called it: a float64 value rounded to float32."""

    def __init__(self):
        super().__init__()
        self.found = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_flatten((args, kwargs))[0] if torch.is_tensor(t)]
        if any(t.dtype in (torch.float64, torch.complex128) for t in inputs) and any(
                torch.is_tensor(t) and t.dtype in LOWER for t in tree_flatten(out)[0]):
            frame = sys._getframe()
            # the package's frame (or fairseq's), not this file's: a checkout's folder may be called fairseq-pe
            while frame is not None and not PACKAGE_FILE.search(frame.f_code.co_filename):
                frame = frame.f_back
            if frame is None:
                self.found.add(f"{func}")
            elif frame.f_code.co_name not in NOT_ENCODINGS:
                path = re.sub(r".*/(fairseq_pe|fairseq)/", r"\1/", frame.f_code.co_filename)
                self.found.add(f"{func} at {path}:{frame.f_lineno}")
        return out


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: at these sizes more threads only add their synchronisation."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def batch(d, padded_target: bool):
    """Source and target of 2 rows, the second's source right-padded, and its target where ``padded_target`` (else
    the decoder's biases are those of the indices, without positions per row)."""
    src = random_tokens(d, 2, 11)
    src[1, 7:] = d.pad()
    prev = random_tokens(d, 2, 9, seed=1)
    if padded_target:
        prev[1, 6:] = d.pad()
    return src, torch.tensor([11, 7]), prev


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_a_float64_model_computes_in_float64_and_equals_float32(name):
    model32, d = build_model(*SYSTEMS[name], *TINY)
    model64 = copy.deepcopy(model32).double()
    src, lengths, prev = batch(d, padded_target=True)
    real = prev.ne(d.pad())
    downcasts = Downcasts()
    with torch.no_grad():  # evaluation: the fused and blocks paths
        out32, _ = model32(src, lengths, prev)
        with downcasts:
            out64, _ = model64(src, lengths, prev)
    assert out64.dtype == torch.float64 and torch.isfinite(out64).all()
    torch.testing.assert_close(out64[real].float(), out32[real], rtol=TOLERANCE, atol=TOLERANCE)
    # training (dropout 0): its paths (blockwise where a bias learns), its positions (randomised: the same draws), and
    # a backward in float64
    src, lengths, prev = batch(d, padded_target=False)
    real = prev.ne(d.pad())
    model32.train(), model64.train()
    torch.manual_seed(1)
    out32, _ = model32(src, lengths, prev)
    torch.manual_seed(1)
    with downcasts:
        out64, _ = model64(src, lengths, prev)
    assert out64.dtype == torch.float64 and torch.isfinite(out64).all()
    torch.testing.assert_close(out64[real].float(), out32[real].detach(), rtol=TOLERANCE, atol=TOLERANCE)
    assert not downcasts.found, f"float64 rounded to a lower precision: {sorted(downcasts.found)}"
    out64[real].pow(2).mean().backward()
    grads = [p.grad for p in model64.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float64 and torch.isfinite(g).all() for g in grads)
