"""TorchScript export of ``transformer_pe``: ``torch.jit.script(model)``, and fairseq's scripted
``SequenceGenerator``, give stock fairseq's scriptable ``transformer`` with the same weights.

``torch.jit.script`` asks every module for ``__prepare_scriptable__`` first; :class:`TransformerPEModel`'s returns
:func:`stock_equivalent`: fairseq's own ``TransformerModel`` of the same configuration and weights, whose input
positions are a table (fairseq's ``LearnedPositionalEmbedding``) holding the plugin's vectors of positions
0 .. ``--max-source-positions``/``--max-target-positions`` − 1 (fairseq numbers positions as the plugin does, from the
first real token, padding skipped).  It computes what the plugin's model computes (checked on a batch before it is
returned), for sentences up to those lengths.  That is what stock fairseq scripts, so it is what can be exported:

* exported: ``--pe-absolute none``, ``learned``, ``sinusoidal``, ``learnable-sinusoidal`` (its frequencies as
  trained) and ``sinusoidal-fairseq``, with any ``--pe-sinusoid-scale``, without ``--pe-all-blocks``;
* refused, with one error naming the option: every ``--pe-relative`` encoding (their terms live inside the
  attention, which stock's scripted attention does not have; RoPE's library is not scriptable), FLOATER (its ODE
  solver is Python), ``--pe-all-blocks`` (vectors at every block's input), ``--pe-random-positions`` (positions
  drawn per sentence).
"""

import copy
from types import SimpleNamespace

import torch

from fairseq_pe.errors import UserError

EXPORTABLE_ABSOLUTE = ("none", "learned", "sinusoidal", "learnable-sinusoidal", "sinusoidal-fairseq")
#: the largest log-probability difference allowed between the model and its stock equivalent (float32)
TOLERANCE = 1e-4


def why_not_exportable(args):
    """The options that keep the model from being exported (flag and value), or ``[]``."""
    reasons = []
    if getattr(args, "pe_relative", "none") != "none":
        reasons.append(f"--pe-relative {args.pe_relative}")
    if getattr(args, "pe_absolute", "none") not in EXPORTABLE_ABSOLUTE:
        reasons.append(f"--pe-absolute {args.pe_absolute}")
    for flag in ("pe_floater_bias", "pe_all_blocks"):
        if getattr(args, flag, False):
            reasons.append("--" + flag.replace("_", "-"))
    if getattr(args, "pe_random_positions", None) is not None:
        reasons.append(f"--pe-random-positions {args.pe_random_positions}")
    return reasons


def stock_equivalent(model):
    """fairseq's ``TransformerModel`` computing what ``model`` (a ``transformer_pe``) computes (module docstring)."""
    from fairseq.models.transformer import TransformerModel

    reasons = why_not_exportable(model.args)
    if reasons:
        raise UserError(f"torch.jit.script: a transformer_pe with {' and '.join(reasons)} cannot be exported to "
                        f"TorchScript (export takes --pe-absolute {', '.join(EXPORTABLE_ABSOLUTE)} without "
                        "--pe-all-blocks, --pe-floater-bias or --pe-random-positions: docs/encodings.md)")
    args = copy.copy(model.args)
    absolute = args.pe_absolute
    args.arch = "transformer"
    args.no_token_positional_embeddings = absolute == "none"
    args.encoder_learned_pos = args.decoder_learned_pos = absolute != "none"
    # the layers as they are (a LayerDrop-pruned model keeps the layers it has)
    args.encoder_layers, args.decoder_layers = len(model.encoder.layers), len(model.decoder.layers)
    args.encoder_layers_to_keep = args.decoder_layers_to_keep = None
    args.encoder_layerdrop = args.decoder_layerdrop = 0.0
    task = SimpleNamespace(source_dictionary=model.encoder.dictionary, target_dictionary=model.decoder.dictionary)
    with torch.random.fork_rng():
        stock = TransformerModel.build_model(args, task)
    state = stock.state_dict()
    ours = model.state_dict()
    for key in state:
        if ".embed_positions." in key:
            continue
        if key not in ours or ours[key].shape != state[key].shape:
            raise UserError(f"torch.jit.script: {key} of the stock transformer has no counterpart in this model")
        state[key] = ours[key]
    for side in ("encoder", "decoder"):
        injector, target = getattr(model, side).embed_positions, getattr(stock, side).embed_positions
        if target is None:
            continue
        # fairseq's learned positions: row padding_idx + 1 + x for position x, zero at padding
        rows = target.weight.size(0) - target.padding_idx - 1
        with torch.no_grad():
            table = injector.absolute(rows).detach().to(state[f"{side}.embed_positions.weight"].dtype)
        weight = torch.zeros_like(state[f"{side}.embed_positions.weight"])
        weight[target.padding_idx + 1:] = table
        state[f"{side}.embed_positions.weight"] = weight
    stock.load_state_dict(state)
    reference = next(model.parameters())
    stock = stock.to(device=reference.device, dtype=model.encoder.embed_tokens.weight.dtype).train(model.training)
    check_equivalent(model, stock)
    return stock


def check_equivalent(model, stock):
    """The two models' log-probabilities on a padded batch agree to :data:`TOLERANCE` (scaled for half precision)."""
    dictionary = model.encoder.dictionary
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(0)
    src = torch.randint(dictionary.nspecial, len(dictionary), (2, 7), generator=g).to(device)
    src[1, :3] = dictionary.pad()
    prev = torch.randint(dictionary.nspecial, len(dictionary), (2, 5), generator=g).to(device)
    prev[:, 0] = dictionary.eos()
    training = model.training
    model.eval(), stock.eval()
    try:
        with torch.no_grad():
            ours = model.get_normalized_probs(model(src, torch.tensor([7, 4]), prev), log_probs=True).float()
            theirs = stock.get_normalized_probs(stock(src, torch.tensor([7, 4]), prev), log_probs=True).float()
    finally:
        model.train(training), stock.train(training)
    tolerance = TOLERANCE if model.encoder.embed_tokens.weight.dtype == torch.float32 else 1e-1
    difference = float((ours - theirs).abs().max())
    if not difference <= tolerance:
        raise UserError(f"torch.jit.script: the stock transformer built for export differs from this model by "
                        f"{difference:.3g} in log-probability (tolerance {tolerance:g}); not exported")
