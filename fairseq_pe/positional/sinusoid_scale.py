"""A scale for the sinusoidal encodings, fixed or learnable (x-transformers' ``ScaledSinusoidalEmbedding``).

The sinusoidal vectors of :mod:`.sinusoidal` and :mod:`.relative_vectors` become

    P_S(x) = S · P(x)

with S fixed (``--pe-sinusoid-scale S``) or a trainable scalar initialised to S
(``--pe-sinusoid-scale-learnable``); ``--pe-relative-sinusoid-scale`` and
``--pe-relative-sinusoid-scale-learnable`` do the same for the relative vectors a^K_r = a^V_r.

Why: every sinusoid has norm √(D/2) (8 at D = 128), whatever D's scale of the token embeddings.
Under fairseq's Transformer recipe the token embeddings are N(0, D^-1/2) times √D, about as large, but
BERT's initialisation (``init_bert_params``: N(0, 0.02), no embedding scaling) makes them 0.02·√D
(0.23 at D = 128): position outweighs the token about 35:1 before the embedding LayerNorm.
S = 0.02·√2 gives the sinusoids BERT's per-coordinate size (a sinusoid's RMS is 1/√2), the size of a
learned position row or a token embedding at initialisation.

Defaults: ``transformer_pe`` S = 1 (the unscaled sinusoids, so stock fairseq and ``sinusoidal-fairseq``
checkpoints convert exactly); ``roberta_pe``: :data:`ROBERTA_DEFAULTS`, chosen by the BERT CPU run
(docs/bert.md).  The scale is in the state dict (``sinusoid_scale``, a parameter or a buffer), so a
checkpoint records the value it was trained with; one saved before the scale existed has none, and
loads with S = 1, as it was trained.
"""

import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn

from fairseq_pe.errors import UserError


logger = logging.getLogger(__name__)

#: the state-dict name of the scale, in every scaled encoding
SCALE_KEY = "sinusoid_scale"

ABSOLUTE_SINUSOIDS = ("sinusoidal", "learnable-sinusoidal", "sinusoidal-fairseq")
RELATIVE_SINUSOIDS = ("sinusoidal", "learnable-sinusoidal")

#: (--pe-sinusoid-scale, learnable) and (--pe-relative-sinusoid-scale, learnable) of ``roberta_pe``
ROBERTA_DEFAULTS = {"absolute": (0.02 * 2 ** 0.5, True), "relative": (1.0, False)}
TRANSFORMER_DEFAULTS = {"absolute": (1.0, False), "relative": (1.0, False)}

_OPTIONS = {"absolute": ("pe_sinusoid_scale", "pe_sinusoid_scale_learnable", "pe_absolute", ABSOLUTE_SINUSOIDS),
            "relative": ("pe_relative_sinusoid_scale", "pe_relative_sinusoid_scale_learnable", "pe_relative",
                         RELATIVE_SINUSOIDS)}


@dataclass
class SinusoidScaleConfig:
    """The sinusoids' scales (:mod:`fairseq_pe.positional.option_fields`)."""

    pe_sinusoid_scale: Optional[float] = field(default=None, metadata={"metavar": "S", "help": (
        "multiply the absolute sinusoids (--pe-absolute sinusoidal, learnable-sinusoidal, sinusoidal-fairseq) by S. "
        "Default: 1 for transformer_pe; %g for roberta_pe, whose BERT initialisation makes the token embeddings small "
        "(0.02 x sqrt(2): the sinusoids get BERT's per-coordinate size)" % ROBERTA_DEFAULTS["absolute"][0])})
    pe_sinusoid_scale_learnable: Optional[bool] = field(default=None, metadata={"negatable": True, "help": (
        "make the absolute sinusoids' scale a trainable scalar initialised to --pe-sinusoid-scale (x-transformers' "
        "scaled sinusoidal embedding); --no-pe-sinusoid-scale-learnable keeps it fixed. Default: %s for roberta_pe, "
        "fixed for transformer_pe" % ("learnable" if ROBERTA_DEFAULTS["absolute"][1] else "fixed"))})
    pe_relative_sinusoid_scale: Optional[float] = field(default=None, metadata={"metavar": "S", "help": (
        "multiply the relative sinusoids (--pe-relative sinusoidal, learnable-sinusoidal: a^K = a^V) by S "
        "(default 1)")})
    pe_relative_sinusoid_scale_learnable: Optional[bool] = field(default=None, metadata={"negatable": True, "help": (
        "make the relative sinusoids' scale a trainable scalar initialised to --pe-relative-sinusoid-scale "
        "(default: fixed)")})


def sinusoid_scale_defaults(args, defaults=TRANSFORMER_DEFAULTS):
    """Fill in the scales of the sinusoidal encodings the model uses; the options of an encoding that is
    not used stay unset (None), so that one given for it is refused by :func:`validate_sinusoid_scale_args`."""
    for kind, (scale, learnable, choice, family) in _OPTIONS.items():
        used = getattr(args, choice, None) in family
        if getattr(args, scale, None) is None:
            setattr(args, scale, defaults[kind][0] if used else None)
        if getattr(args, learnable, None) is None:
            setattr(args, learnable, defaults[kind][1] if used else None)


def validate_sinusoid_scale_args(args):
    for kind, (scale, learnable, choice, family) in _OPTIONS.items():
        used = getattr(args, choice, None) in family
        for name in (scale, learnable):
            if getattr(args, name, None) not in (None, False) and not used:
                flag = "--" + choice.replace("_", "-")
                raise UserError(f"--{name.replace('_', '-')} applies to {flag} {' / '.join(family)} only, not to "
                                f"{flag} {getattr(args, choice, None)}; remove it")
        value = getattr(args, scale, None)
        if value is not None and not value > 0:
            raise UserError(f"--{scale.replace('_', '-')} must be positive, got {value} (for no positions, use "
                            f"--{choice.replace('_', '-')} none)")


def scale_of(args, kind: str):
    """(S, learnable) for the encoding ``kind`` ("absolute" or "relative") from the model's options;
    (1, False) without them (an encoding built outside a model)."""
    scale, learnable = _OPTIONS[kind][:2]
    value = getattr(args, scale, None)
    return (1.0 if value is None else float(value)), bool(getattr(args, learnable, False))


class ScaledSinusoids(nn.Module):
    """Mixin: the scalar ``sinusoid_scale`` (a parameter when learnable, else a buffer: in the state dict
    either way), and the loading of checkpoints saved before it existed (S = 1)."""

    def init_scale(self, scale: float = 1.0, learnable: bool = False):
        if not scale > 0:
            raise ValueError(f"the sinusoids' scale must be positive, got {scale}")
        value = torch.tensor(float(scale))
        if learnable:
            self.sinusoid_scale = nn.Parameter(value)
        else:
            self.register_buffer(SCALE_KEY, value, persistent=True)

    def scaled(self, vectors: torch.Tensor) -> torch.Tensor:
        return vectors * self.sinusoid_scale

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + SCALE_KEY
        if key not in state_dict:
            # saved before the scale existed: the sinusoids were unscaled, and stay so
            if float(self.sinusoid_scale) != 1.0:
                logger.info(f"{prefix or 'sinusoids'}: a checkpoint from before the sinusoids' scale; they stay "
                            f"unscaled (S = 1), as trained, not {float(self.sinusoid_scale):g}")
            state_dict[key] = torch.ones(())
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
