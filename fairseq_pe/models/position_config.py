"""The position options as one typed configuration (issue 56): the ``--pe-*`` flags of ``fairseq-train`` and the
``pe_*`` keys of a ``fairseq-hydra-train`` model config are the fields of :class:`PositionEncodingConfig`.

It composes the choice of encodings and their options (:class:`EncodingChoiceConfig`, here), the sinusoids' scales
(:class:`~fairseq_pe.positional.sinusoid_scale.SinusoidScaleConfig`) and FLOATER's options
(:class:`~fairseq_pe.positional.floater.FloaterConfig`).  fairseq's ``gen_parser_from_dataclass`` makes the flags
(:func:`~fairseq_pe.positional.option_fields.add_dataclass_args`); every field defaults to None or False, and each
model's architecture fills in its defaults (:func:`~fairseq_pe.models.options.position_encoding_defaults`), as
fairseq's own legacy models do.  The checks by name run on the model's options whichever door they came through
(:func:`~fairseq_pe.models.options.validate_position_args`).
"""

import argparse
import contextlib
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import FairseqDataclass

from fairseq_pe.positional import position_encoding_choices
from fairseq_pe.positional.floater import FloaterConfig
from fairseq_pe.positional.option_fields import choices
from fairseq_pe.positional.sinusoid_scale import SinusoidScaleConfig


def sandwich_dim(value: str):
    """``--pe-sandwich-dim``: 'head', 'model' or an integer (checked to be even by the encoding)."""
    if value in ("head", "model"):
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an even number, 'head' or 'model', got {value!r}") from None


#: the choices of the options below (the encodings' own: from their registry)
ABSOLUTE_CHOICES = choices(position_encoding_choices("absolute"))
RELATIVE_CHOICES = choices(position_encoding_choices("relative"))
PE_FOPE_UNUSED_PAIRS_CHOICES = choices(["ones", "unrotated"])
PE_ROPE_SCALING_CHOICES = choices(["none", "linear", "ntk", "yarn"])
PE_RANDOM_EVAL_DECODER_CHOICES = choices(["indices", "spaced"])
PE_ATTENTION_KERNEL_CHOICES = choices(["auto", "sdpa", "blockwise", "flex"])
PE_FIRE_ACTIVATION_CHOICES = choices(["relu", "leaky-relu"])
PE_DAPE_CHOICES = choices(["none", "v1", "v2"])
PE_DAPE_ACTIVATION_CHOICES = choices(["leaky-relu", "relu", "gelu"])


@dataclass
class EncodingChoiceConfig(FairseqDataclass):
    """Which encodings, and the options of each family."""

    pe_absolute: Optional[ABSOLUTE_CHOICES] = field(
        default=None, metadata={"help": (
            "absolute position encoding added to the token embeddings: none; learned (a table of "
            "--max-source/target-positions vectors); sinusoidal (fixed, Vaswani et al.); learnable-sinusoidal "
            "(trainable frequencies, Wang et al.); floater (neural ODE, Liu et al.; see --pe-floater-*); "
            "sinusoidal-fairseq (fairseq's stock sinusoids, for converted stock checkpoints). Default: sinusoidal")})
    pe_all_blocks: bool = field(
        default=False, metadata={"help": (
            "inject the absolute encoding at the input of every block, not only at the embedding layer (sinusoidal: "
            "FLOATER Eq. 7, P(i)+P(n) for block n; learned: one table per block; learnable-sinusoidal: frequencies "
            "shared by all blocks; floater: one initial value per block, dynamics shared, FLOATER §3.2)")})
    pe_relative: Optional[RELATIVE_CHOICES] = field(
        default=None, metadata={"help": (
            "relative position encoding in encoder and decoder self-attention (not in cross-attention): none; learned "
            "(Shaw et al.); sinusoidal (NEZHA); learnable-sinusoidal (Wang et al.); rope; p-rope (Barbero et al. "
            "2025); fope (Hua et al. 2024); xpos; alibi; t5; kerple-log, kerple-power (KERPLE); sandwich; fire; fox "
            "(forgetting attention); cope (contextual positions) (docs/encodings.md). Default: none")})
    pe_relative_max_distance: Optional[int] = field(
        default=None, metadata={"metavar": "K", "help": (
            "learned/sinusoidal/learnable-sinusoidal RPE: clip relative distances to [-K, K] (default 64)")})
    pe_relative_untie_layers: bool = field(
        default=False, metadata={"help": (
            "learned/learnable-sinusoidal RPE and t5: a separate set per layer instead of one shared by all layers")})
    pe_relative_untie_heads: bool = field(
        default=False, metadata={"help": (
            "learned/learnable-sinusoidal RPE: a separate set per attention head instead of one shared by all heads")})
    pe_rope_proportion: Optional[float] = field(
        default=None, metadata={"metavar": "P", "help": (
            "p-rope (Barbero et al. 2025): the share of the dimension pairs that rotate, the floor(P*d/2) of highest "
            "frequency at their RoPE values; the others are not rotated (1: RoPE, 0: no positions). Default: 0.75")})
    pe_rope_resonance: bool = field(
        default=False, metadata={"help": (
            "rope, p-rope: Resonance RoPE (Wang et al. 2024), every wavelength 2*pi/theta rounded to a whole number "
            "of tokens, after any --pe-rope-scaling; in training, or at generation time through --model-overrides "
            "\"{'pe_rope_resonance': True}\"")})
    pe_fope_train_length: Optional[int] = field(
        default=None, metadata={"metavar": "N", "help": (
            "fope (Hua et al. 2024): the training length; RoPE's frequencies below 2*pi/N are clipped to 0 and left "
            "out of the Fourier series (needed with --pe-relative fope)")})
    pe_fope_pairs: Optional[int] = field(
        default=None, metadata={"metavar": "O", "help": (
            "fope: the pairs of dimensions that carry a Fourier series (the others carry the clipped frequencies). "
            "Default: min(M, d/4), M the frequencies kept, d a head's dimension (the authors' code)")})
    pe_fope_init_gain: Optional[float] = field(
        default=None, metadata={"metavar": "G", "help": (
            "fope: the gain of the coefficients' xavier-normal initialisation, around the step identity (default 0.3, "
            "the authors' configs; 0.4 and 0.6 at 180M and 1.2B)")})
    pe_fope_learnable: bool = field(
        default=False, metadata={"help": (
            "fope: train the Fourier coefficients (the authors' configs keep them fixed at their random "
            "initialisation)")})
    pe_fope_unused_pairs: Optional[PE_FOPE_UNUSED_PAIRS_CHOICES] = field(
        default=None, metadata={"help": (
            "fope: the pairs without a series get cos = sin = 1 (ones: the authors' code, a 45-degree turn scaled by "
            "sqrt(2)) or cos = 1, sin = 0 (unrotated: a frequency of 0). Default: ones")})
    pe_rerope_window: Optional[int] = field(
        default=None, metadata={"metavar": "W", "help": (
            "rope, p-rope: ReRoPE (Su 2023) at inference, the relative position capped at W (with "
            "--pe-rerope-leaky-factor K: W + (i-j-W)/K past W); also at generation time through --model-overrides "
            "\"{'pe_rerope_window': 512, 'pe_rerope_train_length': 128}\"")})
    pe_rerope_train_length: Optional[int] = field(
        default=None, metadata={"metavar": "L", "help": (
            "rope, p-rope with --pe-rerope-window: the training length; queries are scaled by max(1, log(i+1)/log L), "
            "as the reference")})
    pe_rerope_leaky_factor: Optional[float] = field(
        default=None, metadata={"metavar": "K", "help": (
            "rope, p-rope with --pe-rerope-window: Leaky ReRoPE, the relative position grows by 1/K past the window "
            "(the reference's 16); without it: ReRoPE")})
    pe_rope_scaling: Optional[PE_ROPE_SCALING_CHOICES] = field(
        default=None, metadata={"help": (
            "rope, p-rope: context extension, also at generation time through --model-overrides: linear (Position "
            "Interpolation, positions / factor), ntk (NTK-aware: base 10000 x factor^(d/(d-2))) or yarn (YaRN: "
            "NTK-by-parts and attention temperature; needs --pe-rope-scaling-original-length). Default: none")})
    pe_rope_scaling_original_length: Optional[int] = field(
        default=None, metadata={"metavar": "N", "help": (
            "rope, p-rope with --pe-rope-scaling yarn: the longest sequence the model was trained on")})
    pe_rope_scaling_factor: Optional[float] = field(
        default=None, metadata={"metavar": "S", "help": (
            "rope, p-rope: the factor of --pe-rope-scaling (>= 1: the length to reach over the training length)")})
    pe_t5_num_buckets: Optional[int] = field(
        default=None, metadata={"help": (
            "t5: number of distance buckets (default 32)")})
    pe_t5_max_distance: Optional[int] = field(
        default=None, metadata={"help": (
            "t5: distance where the last (logarithmic) bucket starts (default 128)")})
    pe_random_positions: Optional[int] = field(
        default=None, metadata={"metavar": "L", "help": (
            "randomised positions (Ruoss et al. 2023): train with a sorted random subset of positions of [0, L) for "
            "each sequence instead of 0..n-1, in every encoding that takes positions (APEs, RoPE/xPos, relative "
            "biases and vectors); in evaluation each source sentence gets a fixed draw of its own and the decoder "
            "0..n-1 (docs/encodings.md). Sequences are at most L long. Default: off")})
    pe_random_eval_decoder: Optional[PE_RANDOM_EVAL_DECODER_CHOICES] = field(
        default=None, metadata={"help": (
            "with --pe-random-positions L, the decoder's positions in evaluation and generation (set it at generation "
            "time with --model-overrides): indices, 0..n−1 (fairseq-pe 0.1's); spaced, the positions that training "
            "draws on average for a target as long as the source, ⌊(t+1)(L+1)/(m+1)⌋−1 for t < m (m the source's "
            "tokens with </s>), then 1 apart past them (docs/encodings.md). Default: indices")})
    pe_attention_kernel: Optional[PE_ATTENTION_KERNEL_CHOICES] = field(
        default=None, metadata={"help": (
            "which computation of attention runs where several give the same result "
            "(docs/speed.md#choosing-the-path---pe-attention-kernel): sdpa, torch's SDPA with one mask holding the "
            "position bias (its size is B×H×T×S); blockwise, blocks of query rows each with its own mask, in linear "
            "memory (evaluation; in training the blockwise path for a bias that learns); flex, torch's FlexAttention "
            "with the bias computed inside the kernel (CUDA training; a forward only on the CPU; where an encoding "
            "cannot, auto's choice); auto, blockwise in evaluation when the mask would exceed 64 MiB, flex in CUDA "
            "training of a learned bias when its mask would be large, sdpa otherwise. The choice is logged once. Set "
            "it for fairseq-generate with --model-overrides \"{'pe_attention_kernel': 'blockwise'}\". Default: auto")})
    pe_fire_threshold: Optional[float] = field(
        default=None, metadata={"metavar": "L0", "help": (
            "fire: the initial threshold L of the normaliser ψ(max(i, L)); L = |λ|·L0 with λ learned from 1 (default "
            "512, the paper's)")})
    pe_fire_activation: Optional[PE_FIRE_ACTIVATION_CHOICES] = field(
        default=None, metadata={"help": (
            "fire: the activation of its MLP's hidden units: relu (the FIRE paper's, Li et al.) or leaky-relu (slope "
            "0.01, DAPE's FIRE, Zheng et al. 2024: the catalogue's fire-dape, with --pe-fire-threshold 64). Default: "
            "relu")})
    pe_sandwich_dim: Optional[str] = field(
        default=None, metadata={"argparse_type": sandwich_dim, "metavar": "D", "help": (
            "sandwich: the dimension d̄ of the sinusoids whose dot products give the bias: an even number, 'head' "
            "(the dimension of one attention head, as NeMo's implementation of the paper) or 'model' (the embedding "
            "dimension, fairseq-pe 0.1's default). Default: head")})
    pe_sandwich_first_frequency: Optional[int] = field(
        default=None, metadata={"choices": [0, 1], "metavar": "K", "help": (
            "sandwich: the sum of cosines runs over k = K .. K + d̄/2 − 1 with ω_k = 10000^(−2k/d̄): 1 as the paper's "
            "sum from 1 to d̄/2 (and NeMo's), 0 as Vaswani et al.'s sinusoids (fairseq-pe 0.1's). Default: 1")})
    pe_fox_gate_std: Optional[float] = field(
        default=None, metadata={"metavar": "STD", "help": (
            "fox (forgetting attention, Lin et al. 2025): the standard deviation of the forget gates' initial weights "
            "(default 0.02, the reference's initializer_range)")})
    pe_fox_gate_bias: Optional[float] = field(
        default=None, metadata={"metavar": "B", "help": (
            "fox: the forget gates' initial bias, sigma(B) the initial gate (default 0, the reference's; "
            "x-transformers' DataDependentAlibi starts at 5)")})
    pe_cope_npos: Optional[int] = field(
        default=None, metadata={"metavar": "N", "help": (
            "cope (Golovneva et al. 2024): positions of the embedding table, 0 .. N-1; a contextual position past N-1 "
            "reads row N-1 (clamped, as the reference). Default: the side's --max-target-positions (encoder: "
            "--max-source-positions) + 1, the reference's block size + 1")})
    pe_cope_nodiv: bool = field(
        default=False, metadata={"help": (
            "cope: add the position term after the 1/sqrt(d) scaling instead of before it (the reference's "
            "--cope-nodiv)")})
    pe_dape: Optional[PE_DAPE_CHOICES] = field(
        default=None, metadata={"help": (
            "DAPE (Zheng et al. 2024) on the --pe-relative bias B (alibi, kerple-log, kerple-power, fire, t5, "
            "sandwich): logits + B + f([logits; B]), f mixing the heads per query and key: v1 an MLP, v2 two 1xK "
            "convolutions along the keys (docs/encodings.md). Default: none")})
    pe_dape_width: Optional[int] = field(
        default=None, metadata={"metavar": "W", "help": (
            "--pe-dape: the hidden width of its network (default 32, the reference's)")})
    pe_dape_activation: Optional[PE_DAPE_ACTIVATION_CHOICES] = field(
        default=None, metadata={"help": (
            "--pe-dape: the activation of its network (default leaky-relu, slope 0.01, the reference's)")})
    pe_dape_kernel: Optional[int] = field(
        default=None, metadata={"metavar": "K", "help": (
            "--pe-dape v2: the convolutions' width along the keys, odd (default 3, the reference's)")})


@dataclass
class PositionEncodingConfig(FloaterConfig, SinusoidScaleConfig, EncodingChoiceConfig):
    """Every position option of the plugin's models (fields in this order: the encodings, the sinusoids' scales,
    FLOATER's)."""


#: a flag named in a message (``--pe-relative``), which the Hydra door names as its key (``model.pe_relative``)
_FLAG = re.compile(r"--(pe-[a-z0-9-]+)")


def as_config_keys(message: str) -> str:
    """``message`` with each ``--pe-*`` flag named as the key of a ``fairseq-hydra-train`` config
    (``model.pe_*``)."""
    return _FLAG.sub(lambda m: "model." + m.group(1).replace("-", "_"), message)


def check_config_keys(cfg):
    """A ``pe_*`` key of a model config that no field of :class:`PositionEncodingConfig` has (a typo in a YAML
    file, or ``+model.pe_relatve=...``): one line naming it, and the keys close to it."""
    import difflib

    from fairseq_pe.errors import UserError

    known = {f.name for f in dataclasses.fields(PositionEncodingConfig)}
    for key in cfg.keys():
        if isinstance(key, str) and key.startswith("pe_") and key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            raise UserError(f"model.{key}: no such position option"
                            + (f" (did you mean {', '.join('model.' + c for c in close)}?)" if close else "")
                            + "; the position options are the pe_* fields of "
                              "fairseq_pe.models.position_config.PositionEncodingConfig (fairseq-train's --pe-* "
                              "flags, - written _)")


@contextlib.contextmanager
def config_door(cfg):
    """The model's options, whichever door they came through.  ``fairseq-train``'s ``argparse.Namespace`` as it
    is; a Hydra ``DictConfig`` (``fairseq-hydra-train``'s YAML, or the configuration a checkpoint of it holds) with
    its ``pe_*`` keys checked against the typed fields (:func:`check_config_keys`), as a ``Namespace`` (fairseq's
    ``TransformerConfig.from_namespace`` copies no key it does not know from a ``DictConfig``), and a user error
    raised inside the block naming keys (``model.pe_relative``) instead of flags: in ``fairseq-hydra-train`` one line
    and exit status 2 (:func:`~fairseq_pe.errors.hydra_user_errors`)."""
    from omegaconf import OmegaConf

    from fairseq_pe.errors import UserError, hydra_user_errors

    if not OmegaConf.is_config(cfg):
        yield cfg
        return
    with hydra_user_errors():  # fairseq-hydra-train: one line and exit 2, as fairseq-train
        try:
            check_config_keys(cfg)
            yield argparse.Namespace(**OmegaConf.to_container(cfg, resolve=True))
        except UserError as e:
            raise type(e)(as_config_keys(str(e))) from e
