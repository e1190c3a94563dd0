"""Command-line options shared by every model of the plugin (``transformer_pe``, later ``roberta_pe``)."""

import argparse
import contextlib
import functools

from fairseq_pe.errors import UserError, as_user_errors
from fairseq_pe.positional import position_encoding_choices
from fairseq_pe.positional.floater import BOUND_DEFAULTS, add_floater_args, floater_defaults, validate_floater_args
from fairseq_pe.positional.sinusoid_scale import (TRANSFORMER_DEFAULTS, add_sinusoid_scale_args,
                                                  sinusoid_scale_defaults, validate_sinusoid_scale_args)
from fairseq_pe.systems import POSITIONLESS_RELATIVE


def add_position_encoding_args(parser):
    """Add ``--pe-*`` options.  No defaults here: architectures set them (fairseq convention)."""
    group = parser.add_argument_group("position encodings (fairseq_pe)")
    group.add_argument(
        "--pe-absolute", choices=position_encoding_choices("absolute"),
        help="absolute position encoding added to the token embeddings: none; learned (a table "
             "of --max-source/target-positions vectors); sinusoidal (fixed, Vaswani et al.); "
             "learnable-sinusoidal (trainable frequencies, Wang et al.); floater (neural ODE, Liu et "
             "al.; see --pe-floater-*); sinusoidal-fairseq (fairseq's stock sinusoids, for converted "
             "stock checkpoints). Default: sinusoidal",
    )
    group.add_argument(
        "--pe-all-blocks", action="store_true",
        help="inject the absolute encoding at the input of every block, not only at the "
             "embedding layer (sinusoidal: FLOATER Eq. 7, P(i)+P(n) for block n; learned: one "
             "table per block; learnable-sinusoidal: frequencies shared by all blocks; floater: "
             "one initial value per block, dynamics shared, FLOATER §3.2)",
    )

    group.add_argument(
        "--pe-relative", choices=position_encoding_choices("relative"),
        help="relative position encoding in encoder and decoder self-attention (not in "
             "cross-attention): none; learned (Shaw et al.); sinusoidal (NEZHA); "
             "learnable-sinusoidal (Wang et al.); rope; p-rope (Barbero et al. 2025); fope (Hua et al. 2024); xpos; alibi; t5; kerple-log, kerple-power (KERPLE); "
             "sandwich; fire; fox (forgetting attention); cope (contextual positions) (docs/encodings.md). "
             "Default: none",
    )
    group.add_argument(
        "--pe-relative-max-distance", type=int, metavar="K",
        help="learned/sinusoidal/learnable-sinusoidal RPE: clip relative distances to [-K, K] (default 64)",
    )
    group.add_argument(
        "--pe-relative-untie-layers", action="store_true",
        help="learned/learnable-sinusoidal RPE and t5: a separate set per layer instead of one shared by all layers",
    )
    group.add_argument(
        "--pe-relative-untie-heads", action="store_true",
        help="learned/learnable-sinusoidal RPE: a separate set per attention head instead of one shared by all heads",
    )
    group.add_argument("--pe-rope-proportion", type=float, metavar="P",
                       help="p-rope (Barbero et al. 2025): the share of the dimension pairs that rotate, the "
                            "floor(P*d/2) of highest frequency at their RoPE values; the others are not rotated "
                            "(1: RoPE, 0: no positions). Default: 0.75")
    group.add_argument("--pe-rope-resonance", action="store_true",
                       help="rope, p-rope: Resonance RoPE (Wang et al. 2024), every wavelength 2*pi/theta rounded to a "
                            "whole number of tokens, after any --pe-rope-scaling; in training, or at generation time "
                            "through --model-overrides \"{'pe_rope_resonance': True}\"")
    group.add_argument("--pe-fope-train-length", type=int, metavar="N",
                       help="fope (Hua et al. 2024): the training length; RoPE's frequencies below 2*pi/N are "
                            "clipped to 0 and left out of the Fourier series (needed with --pe-relative fope)")
    group.add_argument("--pe-fope-pairs", type=int, metavar="O",
                       help="fope: the pairs of dimensions that carry a Fourier series (the others carry the clipped "
                            "frequencies). Default: min(M, d/4), M the frequencies kept, d a head's dimension (the "
                            "authors' code)")
    group.add_argument("--pe-fope-init-gain", type=float, metavar="G",
                       help="fope: the gain of the coefficients' xavier-normal initialisation, around the step "
                            "identity (default 0.3, the authors' configs; 0.4 and 0.6 at 180M and 1.2B)")
    group.add_argument("--pe-fope-learnable", action="store_true",
                       help="fope: train the Fourier coefficients (the authors' configs keep them fixed at their "
                            "random initialisation)")
    group.add_argument("--pe-fope-unused-pairs", choices=["ones", "unrotated"],
                       help="fope: the pairs without a series get cos = sin = 1 (ones: the authors' code, a 45-degree "
                            "turn scaled by sqrt(2)) or cos = 1, sin = 0 (unrotated: a frequency of 0). Default: ones")
    group.add_argument("--pe-rerope-window", type=int, metavar="W",
                       help="rope, p-rope: ReRoPE (Su 2023) at inference, the relative position capped at W (with "
                            "--pe-rerope-leaky-factor K: W + (i-j-W)/K past W); also at generation time through "
                            "--model-overrides \"{'pe_rerope_window': 512, 'pe_rerope_train_length': 128}\"")
    group.add_argument("--pe-rerope-train-length", type=int, metavar="L",
                       help="rope, p-rope with --pe-rerope-window: the training length; queries are scaled by "
                            "max(1, log(i+1)/log L), as the reference")
    group.add_argument("--pe-rerope-leaky-factor", type=float, metavar="K",
                       help="rope, p-rope with --pe-rerope-window: Leaky ReRoPE, the relative position grows by 1/K "
                            "past the window (the reference's 16); without it: ReRoPE")
    group.add_argument("--pe-rope-scaling", choices=["none", "linear", "ntk", "yarn"],
                       help="rope, p-rope: context extension, also at generation time through --model-overrides: linear "
                            "(Position Interpolation, positions / factor), ntk (NTK-aware: base 10000 x "
                            "factor^(d/(d-2))) or yarn (YaRN: NTK-by-parts and attention temperature; needs "
                            "--pe-rope-scaling-original-length). Default: none")
    group.add_argument("--pe-rope-scaling-original-length", type=int, metavar="N",
                       help="rope, p-rope with --pe-rope-scaling yarn: the longest sequence the model was trained on")
    group.add_argument("--pe-rope-scaling-factor", type=float, metavar="S",
                       help="rope, p-rope: the factor of --pe-rope-scaling (>= 1: the length to reach over the training length)")
    group.add_argument("--pe-t5-num-buckets", type=int, help="t5: number of distance buckets (default 32)")
    group.add_argument("--pe-t5-max-distance", type=int,
                       help="t5: distance where the last (logarithmic) bucket starts (default 128)")
    group.add_argument("--pe-random-positions", type=int, metavar="L",
                       help="randomised positions (Ruoss et al. 2023): train with a sorted random subset of positions "
                            "of [0, L) for each sequence instead of 0..n-1, in every encoding that takes positions "
                            "(APEs, RoPE/xPos, relative biases and vectors); in evaluation each source sentence gets a fixed "
                            "draw of its own and the decoder 0..n-1 (docs/encodings.md). Sequences are at "
                            "most L long. "
                            "Default: off")
    group.add_argument("--pe-random-eval-decoder", choices=["indices", "spaced"],
                       help="with --pe-random-positions L, the decoder's positions in evaluation and generation (set it "
                            "at generation time with --model-overrides): indices, 0..n−1 (fairseq-pe 0.1's); spaced, "
                            "the positions that training draws on average for a target as long as the source, "
                            "⌊(t+1)(L+1)/(m+1)⌋−1 for t < m (m the source's tokens with </s>), then 1 apart past "
                            "them (docs/encodings.md). Default: indices")
    group.add_argument("--pe-attention-kernel", choices=["auto", "sdpa", "blockwise", "flex"],
                       help="which computation of attention runs where several give the same result "
                            "(docs/speed.md#choosing-the-path---pe-attention-kernel): sdpa, torch's SDPA with one mask holding the position "
                            "bias (its size is B×H×T×S); blockwise, blocks of query rows each with its own mask, in "
                            "linear memory (evaluation; in training the blockwise path for a bias that learns); flex, "
                            "torch's FlexAttention with the bias computed inside the kernel (CUDA training; a forward "
                            "only on the CPU; where an encoding cannot, auto's choice); auto, blockwise in evaluation "
                            "when the mask would exceed 64 MiB, flex in CUDA training of a learned bias when its mask "
                            "would be large, sdpa otherwise. The choice is logged once. Set it for fairseq-generate "
                            "with --model-overrides \"{'pe_attention_kernel': 'blockwise'}\". Default: auto")
    group.add_argument("--pe-fire-threshold", type=float, metavar="L0",
                       help="fire: the initial threshold L of the normaliser ψ(max(i, L)); L = |λ|·L0 with λ learned "
                            "from 1 (default 512, the paper's)")
    group.add_argument("--pe-fire-activation", choices=["relu", "leaky-relu"],
                       help="fire: the activation of its MLP's hidden units: relu (the FIRE paper's, Li et al.) or "
                            "leaky-relu (slope 0.01, DAPE's FIRE, Zheng et al. 2024: the catalogue's fire-dape, with "
                            "--pe-fire-threshold 64). Default: relu")
    group.add_argument("--pe-sandwich-dim", type=sandwich_dim, metavar="D",
                       help="sandwich: the dimension d̄ of the sinusoids whose dot products give the bias: an even "
                            "number, 'head' (the dimension of one attention head, as NeMo's implementation of the "
                            "paper) or 'model' (the embedding dimension, fairseq-pe 0.1's default). "
                            "Default: head")
    group.add_argument("--pe-sandwich-first-frequency", type=int, choices=[0, 1], metavar="K",
                       help="sandwich: the sum of cosines runs over k = K .. K + d̄/2 − 1 with ω_k = 10000^(−2k/d̄): "
                            "1 as the paper's sum from 1 to d̄/2 (and NeMo's), 0 as Vaswani et al.'s sinusoids "
                            "(fairseq-pe 0.1's). Default: 1")
    group.add_argument("--pe-fox-gate-std", type=float, metavar="STD",
                       help="fox (forgetting attention, Lin et al. 2025): the standard deviation of the forget gates' "
                            "initial weights (default 0.02, the reference's initializer_range)")
    group.add_argument("--pe-fox-gate-bias", type=float, metavar="B",
                       help="fox: the forget gates' initial bias, sigma(B) the initial gate (default 0, the "
                            "reference's; x-transformers' DataDependentAlibi starts at 5)")
    group.add_argument("--pe-cope-npos", type=int, metavar="N",
                       help="cope (Golovneva et al. 2024): positions of the embedding table, 0 .. N-1; a contextual "
                            "position past N-1 reads row N-1 (clamped, as the reference). Default: the side's "
                            "--max-target-positions (encoder: --max-source-positions) + 1, the reference's block "
                            "size + 1")
    group.add_argument("--pe-cope-nodiv", action="store_true",
                       help="cope: add the position term after the 1/sqrt(d) scaling instead of before it (the "
                            "reference's --cope-nodiv)")
    group.add_argument("--pe-dape", choices=["none", "v1", "v2"],
                       help="DAPE (Zheng et al. 2024) on the --pe-relative bias B (alibi, kerple-log, kerple-power, "
                            "fire, t5, sandwich): logits + B + f([logits; B]), f mixing the heads per query and key: v1 "
                            "an MLP, v2 two 1xK convolutions along the keys (docs/encodings.md). Default: none")
    group.add_argument("--pe-dape-width", type=int, metavar="W",
                       help="--pe-dape: the hidden width of its network (default 32, the reference's)")
    group.add_argument("--pe-dape-activation", choices=["leaky-relu", "relu", "gelu"],
                       help="--pe-dape: the activation of its network (default leaky-relu, slope 0.01, the "
                            "reference's)")
    group.add_argument("--pe-dape-kernel", type=int, metavar="K",
                       help="--pe-dape v2: the convolutions' width along the keys, odd (default 3, the reference's)")
    add_sinusoid_scale_args(group)
    add_floater_args(group)


#: the rotary encodings whose frequencies the RoPE options change (scaling at inference, Resonance's rounding)
ROTARY = ("rope", "p-rope")
# options that belong to one family of relative encodings: (option, families, default)
RELATIVE_FAMILY_OPTIONS = [
    ("pe_relative_max_distance", ("learned", "sinusoidal", "learnable-sinusoidal"), 64),
    ("pe_rope_proportion", ("p-rope",), 0.75),
    ("pe_rope_resonance", ROTARY, False),
    ("pe_rope_scaling", ROTARY, "none"),
    ("pe_rope_scaling_factor", ROTARY, None),
    ("pe_rope_scaling_original_length", ROTARY, None),
    ("pe_rerope_window", ROTARY, None),
    ("pe_rerope_train_length", ROTARY, None),
    ("pe_rerope_leaky_factor", ROTARY, None),
    ("pe_fope_train_length", ("fope",), None),
    ("pe_fope_pairs", ("fope",), None),
    ("pe_fope_init_gain", ("fope",), 0.3),
    ("pe_fope_learnable", ("fope",), False),
    ("pe_fope_unused_pairs", ("fope",), "ones"),
    ("pe_t5_num_buckets", ("t5",), 32),
    ("pe_t5_max_distance", ("t5",), 128),
    ("pe_sandwich_dim", ("sandwich",), "head"),
    ("pe_sandwich_first_frequency", ("sandwich",), 1),
    ("pe_fire_threshold", ("fire",), 512.0),
    ("pe_fire_activation", ("fire",), "relu"),
    ("pe_fox_gate_std", ("fox",), 0.02),
    ("pe_fox_gate_bias", ("fox",), 0.0),
    ("pe_cope_npos", ("cope",), None),
    ("pe_cope_nodiv", ("cope",), False),
]
#: DAPE's options: (option, default, the --pe-dape versions that use it)
DAPE_OPTIONS = [("pe_dape_width", 32, ("v1", "v2")), ("pe_dape_activation", "leaky-relu", ("v1", "v2")),
                ("pe_dape_kernel", 3, ("v2",))]
#: relative encodings that take no position at all (positions from the data: FoX's gates, CoPE's counts)
POSITIONLESS = POSITIONLESS_RELATIVE


def position_encoding_defaults(args, sinusoid_scales=TRANSFORMER_DEFAULTS, floater_bounds=BOUND_DEFAULTS):
    """Fill in the defaults of the ``--pe-*`` options (called from architecture functions);
    ``sinusoid_scales``: the model's defaults of the sinusoids' scales (:mod:`~fairseq_pe.positional.sinusoid_scale`);
    ``floater_bounds``: its defaults of ``--pe-floater-bound`` (:func:`~fairseq_pe.positional.floater.floater_defaults`)."""
    args.pe_absolute = getattr(args, "pe_absolute", None) or "sinusoidal"
    args.pe_all_blocks = getattr(args, "pe_all_blocks", False)
    args.pe_relative = getattr(args, "pe_relative", None) or "none"
    args.pe_relative_untie_layers = getattr(args, "pe_relative_untie_layers", False)
    args.pe_relative_untie_heads = getattr(args, "pe_relative_untie_heads", False)
    args.pe_random_positions = getattr(args, "pe_random_positions", None)
    args.pe_random_eval_decoder = getattr(args, "pe_random_eval_decoder", None) or "indices"
    args.pe_attention_kernel = getattr(args, "pe_attention_kernel", None) or "auto"
    args.pe_dape = getattr(args, "pe_dape", None) or "none"
    for name, default, versions in DAPE_OPTIONS:  # given a default only where DAPE uses them (else refused)
        if getattr(args, name, None) is None:
            setattr(args, name, default if args.pe_dape in versions else None)
    if args.pe_relative == "sandwich" and _saved_by_fairseq_pe_0_1(args):
        # it computes what it was trained with: d̄ the embedding dimension, k = 0 .. d̄/2 − 1
        args.pe_sandwich_first_frequency = 0
        args.pe_sandwich_dim = "model"
    for name, families, default in RELATIVE_FAMILY_OPTIONS:
        # a family's options get their default only when it is chosen, so that an option
        # given for another family is refused instead of silently ignored
        if getattr(args, name, None) is None and args.pe_relative in families:
            setattr(args, name, default)
        elif not hasattr(args, name):
            setattr(args, name, None)
    sinusoid_scale_defaults(args, sinusoid_scales)
    floater_defaults(args, floater_bounds)


def _has_option(args, name) -> bool:
    """Whether ``args`` (a Namespace, a SimpleNamespace or fairseq's DictConfig) has ``name`` at all, even as None."""
    try:
        return name in args
    except TypeError:  # a SimpleNamespace
        return hasattr(args, name)


def _saved_by_fairseq_pe_0_1(args) -> bool:
    """A Sandwich model's options as fairseq-pe 0.1 saved them: its architecture function left
    ``pe_sandwich_dim`` None (meaning the embedding dimension) and there was no ``pe_sandwich_first_frequency``.
    Today's never leave it None, and fairseq's parser (``argument_default=SUPPRESS``) omits a flag not given."""
    return (_has_option(args, "pe_sandwich_dim") and getattr(args, "pe_sandwich_dim") is None
            and not _has_option(args, "pe_sandwich_first_frequency"))


def upgrade_saved_options(args):
    """The model options of a loaded checkpoint, before its model is built (fairseq's checkpoint loader,
    :mod:`fairseq_pe.compat`).  fairseq-pe 0.1's are told by what 0.2 always saves: ``pe_sandwich_first_frequency``
    (the architecture function writes it into every model's options, None outside Sandwich).  A 0.1 Sandwich model
    summed k from 0 whatever its ``--pe-sandwich-dim``, and left d̄ None for the embedding dimension: it gets
    ``pe_sandwich_first_frequency`` 0, and d̄ ``model`` where it was None.  Only a checkpoint's options are read so:
    a command line omits every option not given (fairseq's parser), so there the absence says nothing.  An option
    given at loading (``--model-overrides``) is present, and kept.  A 0.1 KERPLE model had one pair r₁, r₂ per layer
    (0.2 shares one pair by all layers; 0.1 refused the untie flag): it gets ``pe_relative_untie_layers``."""
    if args is not None and getattr(args, "pe_relative", None) in ("kerple-log", "kerple-power") \
            and not _has_option(args, "pe_sandwich_first_frequency"):
        from omegaconf import OmegaConf, open_dict

        with open_dict(args) if OmegaConf.is_config(args) else contextlib.nullcontext():
            args.pe_relative_untie_layers = True
    if args is None or getattr(args, "pe_relative", None) != "sandwich" \
            or _has_option(args, "pe_sandwich_first_frequency"):
        return args
    from omegaconf import OmegaConf, open_dict

    with open_dict(args) if OmegaConf.is_config(args) else contextlib.nullcontext():
        args.pe_sandwich_first_frequency = 0
        if getattr(args, "pe_sandwich_dim", None) is None:
            args.pe_sandwich_dim = "model"
    return args


def upgrade_checkpoint_options(state):
    """:func:`upgrade_saved_options` on a loaded checkpoint's model options (``cfg.model``, and the old ``args``)."""
    cfg = state.get("cfg")
    if cfg is not None and cfg.get("model") is not None:
        upgrade_saved_options(cfg["model"])
    upgrade_saved_options(state.get("args"))
    return state


def sandwich_dim(value: str):
    """``--pe-sandwich-dim``: 'head', 'model' or an integer (checked to be even by the encoding)."""
    if value in ("head", "model"):
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an even number, 'head' or 'model', got {value!r}") from None


#: the largest --pe-random-positions: every integer up to 2^24 is exact in float32
MAX_RANDOM_POSITIONS = 1 << 24

# integer options and their smallest allowed value (checked on the value given, so an explicit 0 is refused,
# never replaced by the default)
MINIMUM_VALUES = [
    ("pe_relative_max_distance", 1),
    ("pe_t5_num_buckets", 4),
    ("pe_t5_max_distance", 1),
    ("pe_cope_npos", 2),
    ("pe_dape_width", 1),
    ("pe_dape_kernel", 1),
]


def validate_position_args(args):
    """Refuse contradictory, out-of-range or ineffective position options with a message naming the flag
    to fix (a :class:`~fairseq_pe.errors.UserError`)."""
    with as_user_errors():  # the families' own checks raise ValueError
        _validate_position_args(args)


#: the largest standard deviation of FoX's forget-gate initialisation: gates of larger weights saturate at 0 or 1
#: for every input at initialisation (the reference's 0.02; 1e30 gave NaN gradients in the first update)
MAX_FOX_GATE_STD = 10.0


#: fairseq's DEFAULT_MAX_SOURCE_POSITIONS and DEFAULT_MAX_TARGET_POSITIONS (``fairseq.models.transformer``)
DEFAULT_MAX_POSITIONS = 1024


@functools.lru_cache(maxsize=1)
def _position_actions():
    """The ``--pe-*`` options' argparse actions: their choices, types and flags, the schema every door is held to."""
    parser = argparse.ArgumentParser(add_help=False)
    add_position_encoding_args(parser)
    return tuple(a for a in parser._actions if a.dest.startswith("pe_") and a.option_strings)


def _check_schema(args):
    """Every ``--pe-*`` value (from the flags, ``--model-overrides`` or a YAML configuration) of its option's type
    (a string that the type parses is parsed, as argparse does: ``--model-overrides`` gives what the user typed)
    and among its choices: one line naming the flag."""
    for action in _position_actions():
        value = getattr(args, action.dest, None)
        if value is None or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            continue
        flag, cast = action.option_strings[0], action.type
        if cast in (int, float):
            if isinstance(value, str):
                try:
                    value = cast(value)
                except ValueError:
                    value = None
                if value is not None:
                    setattr(args, action.dest, value)
            if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or (cast is int and isinstance(value, float)):
                raise UserError(f"{flag}: {'an integer' if cast is int else 'a number'} is needed, got "
                                f"{getattr(args, action.dest)!r}")
        if action.choices is not None and value not in action.choices:
            raise UserError(f"{flag} must be one of {', '.join(map(str, action.choices))}, got {value!r}")


def check_finite_position_args(args):
    """Every float ``--pe-*`` value finite (inf and nan are bad input), checked once the model is built, after the
    families' own checks of their options have said what range they need."""
    import math

    with as_user_errors():
        for action in _position_actions():
            value, cast = getattr(args, action.dest, None), action.type
            if cast is float and isinstance(value, float) and not math.isfinite(value):
                raise UserError(f"{action.option_strings[0]} must be finite, got {value!r}")


def _longest_positions(args):
    """The most positions a side of the model reads (its --max-source/target-positions, an LM's
    --tokens-per-sample; fairseq's default where none is set)."""
    lengths = [getattr(args, name, None) for name in ("max_source_positions", "max_target_positions",
                                                       "tokens_per_sample")]
    lengths = [n for n in lengths if isinstance(n, int) and n > 0]
    # unset: fairseq's models fill in DEFAULT_MAX_SOURCE/TARGET_POSITIONS (1024) when they are built
    return max(lengths) if lengths else DEFAULT_MAX_POSITIONS


def _check_costs(args):
    """Options whose size costs memory or time without end are bounded by what the model's lengths can use."""
    longest = _longest_positions(args)
    kernel = getattr(args, "pe_dape_kernel", None)
    if longest is not None and kernel is not None and kernel > 2 * longest + 1:
        raise UserError(f"--pe-dape-kernel {kernel:,} is wider than any row of keys can use: at most 2 × the "
                        f"longest length (--max-source/target-positions, --tokens-per-sample: {longest:,}) + 1 = "
                        f"{2 * longest + 1:,}")
    npos = getattr(args, "pe_cope_npos", None)
    if longest is not None and npos is not None and npos > longest + 1:
        raise UserError(f"--pe-cope-npos {npos:,} has more rows than contextual positions can reach: at most the "
                        f"longest length (--max-source/target-positions, --tokens-per-sample: {longest:,}) + 1 = "
                        f"{longest + 1:,}")
    std = getattr(args, "pe_fox_gate_std", None)
    if std is not None and not 0 <= std <= MAX_FOX_GATE_STD:
        raise UserError(f"--pe-fox-gate-std must be from 0 to {MAX_FOX_GATE_STD:g} (larger initial weights saturate "
                        f"every forget gate; the reference's is 0.02), got {std:g}")


def _validate_position_args(args):
    _check_schema(args)
    _check_costs(args)
    replacements = {
        "encoder_learned_pos": "--pe-absolute learned",
        "decoder_learned_pos": "--pe-absolute learned",
        "no_token_positional_embeddings": "--pe-absolute none",
    }
    for name, use in replacements.items():
        if getattr(args, name, False):
            flag = "--" + name.replace("_", "-")
            raise UserError(
                f"{flag} is fairseq's own position option and is not used by fairseq_pe models; "
                f"use {use} (see --pe-absolute)"
            )
    if args.pe_all_blocks and args.pe_absolute == "none":
        raise UserError("--pe-all-blocks needs an absolute encoding: set --pe-absolute")
    random_positions = getattr(args, "pe_random_positions", None)
    if random_positions is not None:
        if not 1 <= random_positions <= MAX_RANDOM_POSITIONS:
            raise UserError(f"--pe-random-positions must be from 1 (the number of positions to draw from) to "
                            f"{MAX_RANDOM_POSITIONS:,} (2^24: past it float32, in which positions are computed, no "
                            f"longer tells consecutive positions apart), got {random_positions:,}")
        if args.pe_absolute == "floater" or getattr(args, "pe_floater_bias", False):
            raise UserError("--pe-random-positions is not supported with FLOATER (--pe-absolute floater, "
                            "--pe-floater-bias): its positions are the ODE's states at t = i·Δt, solved from 0 up to "
                            "the longest position at every pass; remove one of them")
        if args.pe_absolute == "none" and args.pe_relative == "none":
            raise UserError("--pe-random-positions has no effect without a position encoding: set --pe-absolute or "
                            "--pe-relative, or remove it")
        if args.pe_absolute == "none" and args.pe_relative in POSITIONLESS:
            raise UserError(f"--pe-random-positions has no effect with --pe-relative {args.pe_relative}, which takes "
                            "no positions (they come from the data); add an absolute encoding (--pe-absolute) or "
                            "remove it")
    elif getattr(args, "pe_random_eval_decoder", "indices") not in (None, "indices"):
        raise UserError(f"--pe-random-eval-decoder {args.pe_random_eval_decoder} applies to a model trained with "
                        "--pe-random-positions only; remove it")
    for name, families, _ in RELATIVE_FAMILY_OPTIONS:
        value = getattr(args, name, None)
        if value is not None and value is not False and args.pe_relative not in families:  # a switch: when given
            raise UserError(f"--{name.replace('_', '-')} applies to --pe-relative {' / '.join(families)} only, "
                             f"not to --pe-relative {args.pe_relative}; remove it")
    dape = getattr(args, "pe_dape", None) or "none"
    for name, _, versions in DAPE_OPTIONS:
        if getattr(args, name, None) is not None and dape not in versions:
            raise UserError(f"--{name.replace('_', '-')} applies to --pe-dape {' / '.join(versions)} only, not to "
                            f"--pe-dape {dape}; remove it")
    for name, minimum in MINIMUM_VALUES:
        value = getattr(args, name, None)
        if value is not None and value < minimum:
            raise UserError(f"--{name.replace('_', '-')} must be at least {minimum}, got {value}")
    if args.pe_relative == "none" and (args.pe_relative_untie_layers or args.pe_relative_untie_heads):
        raise UserError("--pe-relative-untie-layers/--pe-relative-untie-heads need --pe-relative")
    for side in ("encoder", "decoder"):
        if getattr(args, f"{side}_xformers_att_config", None):
            raise UserError(f"--{side}-xformers-att-config is not supported by fairseq_pe models: the "
                             "xformers path is fairseq's fused attention path, which skips the position hooks")
    if getattr(args, "cross_self_attention", False):
        for flag, used in (("--pe-relative", args.pe_relative != "none"),
                           ("--pe-floater-bias", getattr(args, "pe_floater_bias", False))):
            if used:
                raise UserError(f"--cross-self-attention is not supported with {flag}: its attention over "
                                "source and target together has no single position axis; remove one of them")
    if getattr(args, "ddp_backend", None) == "fully_sharded":
        half = [flag for flag in ("--fp16", "--bf16", "--memory-efficient-fp16", "--memory-efficient-bf16")
                if getattr(args, flag[2:].replace("-", "_"), False)]
        if half:
            raise UserError(f"--ddp-backend fully_sharded is not supported with {half[0]} by fairseq_pe models: their "
                            "position parameters stay float32 in a half-precision model (exact positions), and "
                            "FSDP flattens the parameters into one dtype; use --ddp-backend c10d (or legacy_ddp)")
    validate_sinusoid_scale_args(args)
    validate_floater_args(args)
