"""Command-line options shared by every model of the plugin (``transformer_pe``, later ``roberta_pe``)."""

import argparse
import contextlib
import functools

from fairseq_pe.errors import UserError, as_user_errors
from fairseq_pe.positional.option_fields import add_dataclass_args
from fairseq_pe.positional.floater import BOUND_DEFAULTS, floater_defaults, validate_floater_args
from fairseq_pe.positional.sinusoid_scale import (TRANSFORMER_DEFAULTS, sinusoid_scale_defaults,
                                                  validate_sinusoid_scale_args)
from fairseq_pe.systems import POSITIONLESS_RELATIVE

from .position_config import PositionEncodingConfig


def add_position_encoding_args(parser):
    """Add the ``--pe-*`` flags, the fields of :class:`~.position_config.PositionEncodingConfig`.  No defaults
    here: architectures set them (fairseq convention)."""
    group = parser.add_argument_group("position encodings (fairseq_pe)")
    add_dataclass_args(group, PositionEncodingConfig)


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
