"""What half precision changes in what positions change: a model's per-token log-probabilities and the gradients of
its position parameters in fp16 or bf16 against float32, beside what removing or permuting the positions changes.

A comparison of training losses cannot see a wrong position: removing ALiBi from the tiny model of the tests moves
its loss by 0.08 %, far below what fp16 and bf16 move it.  What positions change is the distribution each target
token gets, on a padded batch (the source padded left, the target right, as fairseq batches them), and the gradients
of the parameters that only the position encoding has.  :func:`compare_precisions` measures, for a built model and a
batch:

* ``logprob_deviation``: max over real target tokens and the vocabulary of |log p_half − log p_float32|, the
  float32 model having the half model's own weights (converted back: the rounding of the weights is no error of the
  computation, and in bf16 it alone moves the log-probs about as much as a weak encoding does);
* ``gradient_deviations``: per position parameter, ‖g_half − g_float32‖ / ‖g_float32 of its encoding‖ (gradients
  of the summed negative log-likelihood of the target, fairseq's criterion without smoothing; the norm of all the
  parameters of the encoding the parameter belongs to, :func:`gradient_deviations`);

and, in float32, the *position effect* those deviations are to be read against:

* ``logprob_effect_removed``: the same max |Δ log p| between the model and the model whose every position encoding
  is switched off (:func:`positions_removed`): absolute vectors zero, no relative bias, rotation or relative
  vectors, FLOATER's Q/K/V biases zero;
* ``logprob_effect_permuted`` and ``gradient_effects``: the change of the log-probs (max |Δ|) and of each position
  parameter's gradient (relative, as above) when the real source tokens of every row are permuted
  (:func:`permuted_source`, EOS and padding kept in place).  Without positions fairseq's encoder is
  permutation-equivariant and its cross-attention permutation-invariant, so this is what the source's positions
  contribute.

:meth:`PrecisionReport.failures` states the check: each deviation within its tolerance (:class:`Tolerance`,
:data:`DEFAULT_TOLERANCES`), and a batch on which the check can see the encoding missing: removing it moves the
log-probs by ``margin`` tolerances or more, or it has position parameters, whose whole gradient it would lose (a model
without positions, ``--pe-absolute none``, has nothing to see).  A fault injected into the half-precision model only
(``fault=``: :func:`positions_removed`, :func:`positions_shifted`, or a test's own patch) makes it fail, naming the
precision, the encoding and the parameter.

Positions are found from the registry's interfaces, not by name: every module that is a
:class:`~fairseq_pe.positional.PositionInjector` (``embed_positions`` of each side: its absolute and relative
encodings, FLOATER's biases) or a :class:`~fairseq_pe.positional.floater.FloaterFlow` (the shared dynamics), and
every absolute or relative encoding of the registry wherever it sits (:func:`position_modules`).

The model is never changed: each precision runs on a copy (``copy.deepcopy``), converted as fairseq's trainer
converts it (``.half()`` for ``--fp16``, ``.to(torch.bfloat16)`` for ``--bf16``; :class:`~fairseq_pe.positional.base.
Float32State` keeps the position state in float32), in evaluation mode (no dropout; randomised positions are each
sentence's own fixed draw; the decoder's positions are 0 .. n−1 there: the trainer's update of
``tests/test_half_precision_training.py`` covers the training draws).  On CPU, torch's fp16 and bf16 matrix products
accumulate in float32, as a GPU's tensor cores do; the tolerances were measured on the CPU (none has run on a GPU
yet).

Example (``fairseq-pe-gpu-check``'s ``positions`` check)::

    from fairseq_pe.diagnostics.precision import compare_precisions, DEFAULT_TOLERANCES
    reports = compare_precisions(model, sample, ["fp16", "bf16"], device="cuda")
    for report in reports.values():
        problems = report.failures(DEFAULT_TOLERANCES[report.precision])
"""

import contextlib
import copy
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn as nn

from fairseq_pe.positional.base import AbsolutePositionEncoding, RelativePositionEncoding
from fairseq_pe.positional.floater import FloaterFlow
from fairseq_pe.positional.floater_bias import FloaterAttentionBias
from fairseq_pe.positional.injector import PositionInjector

#: the dtype of each precision name (fairseq's ``--fp16`` / ``--bf16``; ``memory-efficient-*`` convert the same)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
          "memory-efficient-fp16": torch.float16, "memory-efficient-bf16": torch.bfloat16}


@dataclass(frozen=True)
class Tolerance:
    """What a half-precision model may deviate from float32 (:meth:`PrecisionReport.failures`).

    ``logprob``: max |Δ log p| over real target tokens and the vocabulary; ``gradient``: ‖Δg‖ / ‖g of the encoding‖
    of each position parameter; ``margin``: the check must be able to see the encoding missing: removing it moves the
    log-probs by at least ``margin × logprob``, or it has position parameters (removing it takes their whole
    gradient: a deviation of 1, at least ``margin × gradient``).  With a tolerance of at least 2.5 times the
    measured noise, a margin of 1.5 leaves a missing encoding at least 1.1 tolerances away (its effect less the
    noise)."""

    logprob: float
    gradient: float
    margin: float = 1.5


#: measured on the tests' tiny model (CPU, every encoding of ``tests/test_half_precision_training.py`` and 6 batches of
#: 40/25/9 source and 30/18/6 target tokens): at most 3.4e-3 (fp16) and 3.3e-2 (bf16) for the log-probs, 3.1e-2 (fp16:
#: FIRE with randomised positions) and 0.14 (bf16: FLOATER's Q/K/V biases) for the gradients, whose sums nearly cancel
#: there; bf16 keeps 8 bits of mantissa, fp16 11.  A removed encoding moves the log-probs by 0.2 to 4.5 (FIRE's, 0.02
#: to 0.06, is seen by its gradients) and its parameters' gradients by 1.
DEFAULT_TOLERANCES = {
    "fp16": Tolerance(logprob=0.02, gradient=0.1),
    "bf16": Tolerance(logprob=0.08, gradient=0.35),
}
DEFAULT_TOLERANCES["memory-efficient-fp16"] = DEFAULT_TOLERANCES["fp16"]
DEFAULT_TOLERANCES["memory-efficient-bf16"] = DEFAULT_TOLERANCES["bf16"]


@dataclass
class PrecisionReport:
    """One precision against float32 on one batch (:func:`compare_precisions`); every number is a Python float."""

    precision: str  #: "fp16", "bf16", ...
    encoding: str  #: what the model's positions are (:func:`describe_positions`)
    #: (B, T) max over the vocabulary of |log p_half − log p_float32| per target token, 0 at padding (on the CPU)
    token_deviations: torch.Tensor
    logprob_deviation: float  #: the max of ``token_deviations``
    #: the same max against the original float32 weights (the weights' rounding included): for information
    logprob_deviation_from_float32: float
    #: position parameter name -> ‖g_half − g_float32‖ / ‖g_float32 of its encoding‖ (:func:`gradient_deviations`)
    gradient_deviations: Dict[str, float]
    logprob_effect_removed: float  #: max |Δ log p| in float32 when every position encoding is switched off
    logprob_effect_permuted: float  #: max |Δ log p| in float32 when each row's real source tokens are permuted
    #: position parameter name -> ‖g_permuted − g‖ / ‖g of its encoding‖ in float32 (source permuted)
    gradient_effects: Dict[str, float] = field(default_factory=dict)

    def failures(self, tolerance: Tolerance) -> List[str]:
        """What fails, one sentence each naming the precision, the encoding and the parameter; [] when it passes."""
        name = f"{self.precision} {self.encoding}"
        problems = []
        if not self.logprob_deviation <= tolerance.logprob:  # nan fails too
            problems.append(f"{name}: log-probs deviate from float32 by {self.logprob_deviation:.3g} > "
                            f"{tolerance.logprob:g} (removing the positions moves them by "
                            f"{self.logprob_effect_removed:.3g})")
        for parameter, deviation in self.gradient_deviations.items():
            if not deviation <= tolerance.gradient:
                problems.append(f"{name}: the gradient of {parameter} deviates from float32's by {deviation:.3g} "
                                f"(relative) > {tolerance.gradient:g}")
        if not self.sees_missing_positions(tolerance):
            problems.append(f"{name}: removing the positions moves the log-probs by only "
                            f"{self.logprob_effect_removed:.3g} < {tolerance.margin:g} × {tolerance.logprob:g}, and "
                            "no position parameter has a gradient to lose: this check cannot show a missing encoding")
        return problems

    @property
    def has_positions(self) -> bool:
        return self.encoding != "none"

    def sees_missing_positions(self, tolerance: Tolerance) -> bool:
        """Whether the check at ``tolerance`` fails for the model without its positions: by the log-probs, or by
        the gradients of its position parameters (all lost: a deviation of 1); True for a model without any."""
        by_logprobs = self.logprob_effect_removed >= tolerance.margin * tolerance.logprob
        by_gradients = bool(self.gradient_deviations) and tolerance.margin * tolerance.gradient <= 1.0
        return not self.has_positions or by_logprobs or by_gradients

    def row(self) -> Dict[str, object]:
        """The report as a JSON-ready dict (no tensors): scalars, the per-parameter dicts, the worst parameter."""
        worst = max(self.gradient_deviations.items(), key=lambda kv: _order(kv[1]), default=(None, 0.0))
        return {"precision": self.precision, "encoding": self.encoding,
                "logprob_deviation": self.logprob_deviation,
                "logprob_deviation_from_float32": self.logprob_deviation_from_float32,
                "logprob_effect_removed": self.logprob_effect_removed,
                "logprob_effect_permuted": self.logprob_effect_permuted,
                "gradient_deviation_max": worst[1], "gradient_deviation_worst": worst[0],
                "gradient_effect_max": max(self.gradient_effects.values(), default=None),
                "gradient_deviations": dict(self.gradient_deviations),
                "gradient_effects": dict(self.gradient_effects)}


def _order(value: float) -> float:
    return math.inf if math.isnan(value) else value


# ---------------------------------------------------------------------------------------------- finding positions


def position_modules(model: nn.Module) -> List[nn.Module]:
    """The modules of ``model`` that hold its positions: each side's ``PositionInjector``, FLOATER's flow, and every
    registered encoding (also one outside an injector)."""
    # every class of the registry implements one of the two interfaces (base.register_position_encoding)
    kinds = (PositionInjector, FloaterFlow, FloaterAttentionBias, AbsolutePositionEncoding, RelativePositionEncoding)
    return [m for m in model.modules() if isinstance(m, kinds)]


def position_owners(model: nn.Module) -> Dict[str, str]:
    """Position parameter name -> the name of the innermost position module that holds it (its encoding: e.g.
    ``encoder.embed_positions.relative``, ``floater``)."""
    modules = {id(m) for m in position_modules(model)}
    names = [name for name, m in model.named_modules() if id(m) in modules]
    return {parameter: max((n for n in names if parameter.startswith(n + ".")), key=len)
            for parameter in position_parameters(model)}


def position_parameters(model: nn.Module) -> Dict[str, nn.Parameter]:
    """Every trainable parameter that belongs to a position encoding (:func:`position_modules`), by its name in
    ``model.named_parameters()``: learned tables, learnable frequencies, T5/KERPLE/FIRE parameters, relative vectors,
    FLOATER's initial values and dynamics."""
    owned = {id(p) for m in position_modules(model) for p in m.parameters()}
    return {name: p for name, p in model.named_parameters() if id(p) in owned and p.requires_grad}


def describe_positions(model: nn.Module) -> str:
    """The model's encodings as its options name them, e.g. ``"absolute sinusoidal + relative alibi"``; ``"none"``."""
    parts = []
    for m in model.modules():
        if isinstance(m, PositionInjector):
            for kind, encoding in (("absolute", m.absolute), ("relative", m.relative)):
                if encoding is not None:
                    parts.append(f"{kind} {encoding.registry_name}")
            if m.self_bias is not None:
                parts.append("floater-bias")
            if m.random_positions is not None:
                parts.append(f"random-positions {m.random_positions}")
    return " + ".join(dict.fromkeys(parts)) or "none"


# ---------------------------------------------------------------------------------------------- faults and effects


def _patch(module: nn.Module, name: str, function: Callable, patched: list):
    """Set ``module.name`` (an instance attribute, over the class's method) and remember to remove it."""
    module.__dict__[name] = function
    patched.append((module, name))


@contextlib.contextmanager
def positions_removed(model: nn.Module):
    """Within the block, every position encoding of ``model`` (this instance only) contributes nothing: absolute
    vectors are zero, relative encodings add no bias, rotate nothing and add no relative vectors (their hooks answer
    as :class:`~fairseq_pe.positional.base.RelativePositionEncoding`'s defaults; the logits hook gives q·kᵀ alone),
    FLOATER's Q/K/V biases are zero.
    The model then sees positions only through the decoder's causal mask.  The encodings' parameters get no
    gradient."""
    patched: list = []
    try:
        for m in position_modules(model):
            if isinstance(m, AbsolutePositionEncoding):
                _patch(m, "forward", _zeros_of(m.forward), patched)
            if isinstance(m, RelativePositionEncoding):
                base = RelativePositionEncoding
                _patch(m, "rotate", lambda q, k, offset, block, scale=1.0, rows=None, _m=m: base.rotate(
                    _m, q, k, offset, block, scale), patched)
                for hook in ("position_bias", "logit_terms", "value_terms", "key_state"):
                    _patch(m, hook, lambda *args, **kwargs: None, patched)
                # the logits hook (FoX, CoPE, DAPE): q·kᵀ alone
                _patch(m, "attention_logits", lambda q, k, *args, _m=m, **kwargs: base.attention_logits(_m, q, k, 0, 1),
                       patched)
                if hasattr(m, "folded_vectors"):
                    _patch(m, "folded_vectors", _zeros_of(m.folded_vectors), patched)
            if isinstance(m, PositionInjector) and (m.self_bias is not None or m.cross_bias is not None):
                _patch(m, "attention_bias", _zeros_of(m.attention_bias), patched)
        yield model
    finally:
        for module, name in patched:
            del module.__dict__[name]


def _zeros_of(function: Callable) -> Callable:
    def zeros(*args, **kwargs):
        out = function(*args, **kwargs)
        if isinstance(out, tuple):
            return tuple(torch.zeros_like(t) for t in out)
        return torch.zeros_like(out)

    return zeros


@contextlib.contextmanager
def positions_shifted(model: nn.Module, by: int = 1):
    """A wrong position: within the block, ``model``'s absolute encodings give position x the vector of x + ``by``,
    and its relative biases give distance j − i the bias of j − i + ``by`` (FLOATER's biases and rotations are left
    as they are: use :func:`positions_removed` for them; a relative bias on the rows' own positions, randomised or
    FIRE's on a padded batch, is refused)."""
    patched: list = []
    try:
        for m in position_modules(model):
            if isinstance(m, AbsolutePositionEncoding):
                def shifted(length, block=1, _forward=m.forward):
                    return _forward(length + by, block)[by:]

                _patch(m, "forward", shifted, patched)
            if isinstance(m, RelativePositionEncoding) and m.adds_bias:
                def bias(tgt_len, src_len, query_offset, block, rows=None, _bias=m.position_bias):
                    if rows is not None and rows.positions is not None:
                        raise ValueError("positions_shifted shifts the distances of positions 0 .. n−1, not the rows' "
                                         "own (randomised positions, FIRE on a padded batch)")
                    out = _bias(tgt_len, src_len + by, query_offset, block, rows=rows)  # keys 0 .. S + by − 1
                    return None if out is None else out[..., by:]  # key j reads the bias of key j + by

                _patch(m, "position_bias", bias, patched)
        yield model
    finally:
        for module, name in patched:
            del module.__dict__[name]


def permuted_source(sample: dict, pad: int, seed: int = 0) -> dict:
    """A copy of fairseq's ``sample`` whose real source tokens of each row are permuted at random (EOS, the last real
    token, and the padding stay where they are); lengths, targets and ``prev_output_tokens`` are unchanged."""
    tokens = sample["net_input"]["src_tokens"]
    g = torch.Generator().manual_seed(seed)
    permuted = tokens.clone()
    real = tokens.ne(pad).cpu()
    for row in range(tokens.size(0)):
        index = real[row].nonzero().flatten()[:-1]  # the real tokens but EOS (fairseq appends it)
        permuted[row, index] = tokens[row, index[torch.randperm(len(index), generator=g)].to(tokens.device)]
    net_input = dict(sample["net_input"], src_tokens=permuted)
    return dict(sample, net_input=net_input)


# ---------------------------------------------------------------------------------------------- the comparison


def _to_device(sample, device):
    from fairseq import utils

    return utils.apply_to_sample(lambda t: t.to(device), sample)


def _converted(model: nn.Module, precision: str, device) -> nn.Module:
    """A copy of ``model`` on ``device`` in ``precision``, as fairseq's trainer converts it, in evaluation mode."""
    copied = copy.deepcopy(model).to(device).float()
    if precision in ("fp16", "memory-efficient-fp16"):
        copied = copied.half()
    elif precision != "fp32":
        copied = copied.to(dtype=DTYPES[precision])
    return copied.eval()


def _pass(model: nn.Module, sample: dict, pad: int, loss_scale: float = 1.0):
    """(log-probs (B, T, V) float32 detached, {position parameter: float32 gradient}) of one forward and backward.

    The loss is the summed negative log-likelihood of the target's real tokens (fairseq's criterion without
    smoothing), times ``loss_scale`` (fp16's loss scaling), whose gradients are unscaled here."""
    params = position_parameters(model)
    net_output = model(**sample["net_input"])
    lprobs = model.get_normalized_probs(net_output, log_probs=True).float()
    target = sample["target"]
    real = target.ne(pad)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1).masked_fill(~real, 0.0).sum()
    grads = {}
    if params:
        values = torch.autograd.grad(nll * loss_scale, list(params.values()), allow_unused=True)
        for (name, p), g in zip(params.items(), values):
            grads[name] = (torch.zeros_like(p, dtype=torch.float32) if g is None else g.float() / loss_scale).detach()
    return lprobs.detach(), grads


def _token_deviation(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(B, T) max over the vocabulary of |a − b|, 0 at padding (nan where either is not finite)."""
    diff = (a - b).abs().amax(dim=-1)
    return diff.masked_fill(~real, 0.0)


def _max(t: torch.Tensor) -> float:
    if torch.isnan(t).any():
        return math.nan
    return float(t.max()) if t.numel() else 0.0


def gradient_deviations(got: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor],
                         owners: Dict[str, str]) -> Dict[str, float]:
    """Per parameter ‖got − expected‖ / ‖expected's gradient of the whole encoding‖ (all parameters of its owner,
    :func:`position_owners`): a parameter whose true gradient is 0 (FIRE's output bias b₂ shifts a whole row of
    logits, which the softmax ignores) is then measured against what the encoding's gradient is, not against its
    own rounding.  0 when both are 0, inf when only the encoding's reference gradient is 0, nan when either is not
    finite."""
    squares: Dict[str, float] = {}
    for name, g in expected.items():
        squares[owners[name]] = squares.get(owners[name], 0.0) + float(g.double().pow(2).sum())
    deviations = {}
    for name, g in expected.items():
        if not (torch.isfinite(got[name]).all() and torch.isfinite(g).all()):
            deviations[name] = math.nan
            continue
        diff, norm = float((got[name] - g).norm()), math.sqrt(squares[owners[name]])
        deviations[name] = diff / norm if norm > 0 else (0.0 if diff == 0.0 else math.inf)
    return deviations


def compare_precisions(model: nn.Module, sample: dict, precisions: Sequence[str] = ("fp16", "bf16"),
                       device=None, loss_scale: Optional[Dict[str, float]] = None,
                       fault: Optional[Callable[[nn.Module], contextlib.AbstractContextManager]] = None,
                       permutation_seed: int = 0) -> Dict[str, PrecisionReport]:
    """Each precision of ``precisions`` against float32 on fairseq's ``sample``: {precision: :class:`PrecisionReport`}.

    The half-precision model is compared with the same weights computed in float32 (its fp16/bf16 weights converted
    back: the rounding of the weights is no error of the computation, and in bf16 it alone moves the log-probs about
    as much as some encodings do; ``logprob_deviation_from_float32`` also gives the deviation from the original
    float32 weights).  The position effects are the float32 model's.

    Args:
        model: a built fairseq encoder-decoder (``transformer_pe``: ``model(**sample["net_input"])`` and
            ``get_normalized_probs``), in any dtype; it is copied, never changed.
        sample: a fairseq batch (``net_input`` with ``src_tokens``, ``src_lengths``, ``prev_output_tokens``;
            ``target``), e.g. :func:`fairseq_pe.synthetic.random_batch`: a padded batch shows what positions do.
        precisions: names of :data:`DTYPES` ("fp16", "bf16", ...).
        device: where to run (default: the model's device).
        loss_scale: precision -> the factor the loss is multiplied by before backward (fairseq's dynamic loss scale;
            default 1: the probe's loss is one small batch's).
        fault: ``fault(half_model)`` is entered around the half-precision passes only (e.g. :func:`positions_removed`
            or :func:`positions_shifted`): a check that must then fail.
        permutation_seed: seed of :func:`permuted_source`.
    """
    if device is None:
        device = next(model.parameters()).device
    pad = model.decoder.dictionary.pad()
    sample = _to_device(sample, device)
    real = sample["target"].ne(pad)
    original = _converted(model, "fp32", device)
    encoding = describe_positions(original)
    owners = position_owners(original)
    lprobs, grads = _pass(original, sample, pad)
    with positions_removed(original):
        removed, _ = _pass(original, sample, pad)
    permuted_lprobs, permuted_grads = _pass(original, permuted_source(sample, pad, permutation_seed), pad)
    effect_removed = _max(_token_deviation(removed, lprobs, real))
    effect_permuted = _max(_token_deviation(permuted_lprobs, lprobs, real))
    gradient_effects = gradient_deviations(permuted_grads, grads, owners)
    reports = {}
    for precision in precisions:
        half = _converted(model, precision, device)
        same_weights = copy.deepcopy(half).float()  # the half model's weights, computed in float32
        expected_lprobs, expected_grads = _pass(same_weights, sample, pad)
        scale = (loss_scale or {}).get(precision, 1.0)
        with (fault(half) if fault is not None else contextlib.nullcontext()):
            half_lprobs, half_grads = _pass(half, sample, pad, scale)
        tokens = _token_deviation(half_lprobs, expected_lprobs, real)
        reports[precision] = PrecisionReport(
            precision=precision, encoding=encoding, token_deviations=tokens.cpu(), logprob_deviation=_max(tokens),
            logprob_deviation_from_float32=_max(_token_deviation(half_lprobs, lprobs, real)),
            gradient_deviations=gradient_deviations(half_grads, expected_grads, owners),
            logprob_effect_removed=effect_removed, logprob_effect_permuted=effect_permuted,
            gradient_effects=gradient_effects)
    return reports


def probe_precision(model: nn.Module, sample: dict, precision: str = "fp16", **kwargs) -> PrecisionReport:
    """:func:`compare_precisions` for one precision."""
    return compare_precisions(model, sample, [precision], **kwargs)[precision]


def failures(reports: Iterable[PrecisionReport], tolerances: Optional[Dict[str, Tolerance]] = None) -> List[str]:
    """Every failure of ``reports`` at ``tolerances`` (default :data:`DEFAULT_TOLERANCES`)."""
    tolerances = tolerances or DEFAULT_TOLERANCES
    return [problem for report in reports for problem in report.failures(tolerances[report.precision])]
