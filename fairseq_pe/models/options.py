"""Command-line options shared by every model of the plugin (``transformer_pe``, later ``roberta_pe``)."""

from fairseq_pe.positional import position_encoding_choices


def add_position_encoding_args(parser):
    """Add ``--pe-*`` options.  No defaults here: architectures set them (fairseq convention)."""
    group = parser.add_argument_group("position encodings (fairseq_pe)")
    group.add_argument(
        "--pe-absolute", choices=position_encoding_choices("absolute"),
        help="absolute position encoding added to the token embeddings: none; learned (a table "
             "of --max-source/target-positions vectors); sinusoidal (fixed, Vaswani et al.); "
             "learnable-sinusoidal (trainable frequencies, Wang et al.). Default: sinusoidal",
    )
    group.add_argument(
        "--pe-all-blocks", action="store_true",
        help="inject the absolute encoding at the input of every block, not only at the "
             "embedding layer (sinusoidal: FLOATER Eq. 7, P(i)+P(n) for block n; learned: one "
             "table per block; learnable-sinusoidal: frequencies shared by all blocks)",
    )


def position_encoding_defaults(args):
    """Fill in the defaults of the ``--pe-*`` options (called from architecture functions)."""
    args.pe_absolute = getattr(args, "pe_absolute", None) or "sinusoidal"
    args.pe_all_blocks = getattr(args, "pe_all_blocks", False)


def reject_stock_position_flags(args):
    """fairseq's own position flags would silently fight ``--pe-absolute``: refuse them."""
    replacements = {
        "encoder_learned_pos": "--pe-absolute learned",
        "decoder_learned_pos": "--pe-absolute learned",
        "no_token_positional_embeddings": "--pe-absolute none",
    }
    for name, use in replacements.items():
        if getattr(args, name, False):
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"{flag} is fairseq's own position option and is not used by fairseq_pe models; "
                f"use {use} (see --pe-absolute)"
            )
    if args.pe_all_blocks and args.pe_absolute == "none":
        raise ValueError("--pe-all-blocks needs an absolute encoding: set --pe-absolute")
