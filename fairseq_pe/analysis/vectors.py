"""Position vectors and identical-word attention logits of a model (Wang et al. 2021, §3.1, §5.2).

Works for ``transformer_pe`` and ``roberta_pe`` models (every ``--pe-*`` encoding, FLOATER
included) and for fairseq's stock ``transformer``/``roberta`` (sinusoidal or learned positions),
on the encoder side (RoBERTa's sentence encoder) or, for translation models, the decoder side.
"""

from typing import Dict, List, Tuple

import torch

from fairseq_pe.models.floater_setup import floater_pass, flow_of
from fairseq_pe.positional.injector import PositionInjector
from fairseq_pe.positional.pass_state import current_pass, pass_scope

SIDES = ("encoder", "decoder")


def side_of(model, side: str = "encoder"):
    """The Transformer stack holding the positions: the encoder (RoBERTa's sentence encoder) or the decoder."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, not {side!r}")
    if side == "decoder":
        decoder = getattr(model, "decoder", None)
        if decoder is None or not hasattr(decoder, "layers"):
            raise ValueError("--side decoder: this model has no Transformer decoder (RoBERTa is an encoder)")
        return decoder
    encoder = model.encoder
    return getattr(encoder, "sentence_encoder", encoder)


def absolute_vectors(model, length: int, side: str = "encoder") -> Dict[int, torch.Tensor]:
    """Block -> (length, D) absolute vectors of ``side`` (only block 1 unless every block has its
    own); empty without an absolute encoding."""
    encoder = side_of(model, side)
    injector = encoder.embed_positions
    if injector is None:
        return {}
    with torch.no_grad():
        if isinstance(injector, PositionInjector):
            if injector.absolute is None:
                return {}
            blocks = range(1, len(encoder.layers) + 1) if injector.all_blocks else [1]
            with floater_pass(flow_of(injector), length):
                return {b: injector.absolute(length, b).detach().double().clone() for b in blocks}
        # fairseq's own modules (offsets by padding_idx + 1 internally)
        pad = encoder.padding_idx
        tokens = torch.full((1, length), pad + 1, dtype=torch.long)
        return {1: injector(tokens)[0].detach().double().clone()}


def floater_bias_vectors(model, length: int, side: str = "encoder") -> Dict[int, torch.Tensor]:
    """Block -> (length, 3, D) FLOATER self-attention biases b_{q,k,v,i} of ``side`` (§3.3, Eq. 13);
    empty without ``--pe-floater-bias``."""
    injector = side_of(model, side).embed_positions
    client = getattr(injector, "self_bias", None)
    if client is None:
        return {}
    flow = flow_of(injector)
    with torch.no_grad(), floater_pass(flow, length):
        states = flow.states(client, length).detach().double()  # (length, blocks·3, D)
    states = states.reshape(length, client.num_blocks, -1, states.size(-1))
    return {b + 1: states[:, b].clone() for b in range(client.num_blocks)}


def relative_vectors(model, side: str = "encoder") -> Dict[int, Tuple[torch.Tensor, torch.Tensor]]:
    """Block -> (a^K, a^V) of a vector-valued relative encoding, each (2K+1, d) or (H, 2K+1, d), index
    r + K for the distance r = j - i; block 1 only when the blocks share them (the default); empty
    for other encodings (RoPE, ALiBi, T5 act on the logits only: see :func:`identical_word_logits`)."""
    encoder = side_of(model, side)
    rel = getattr(encoder.embed_positions, "relative", None)
    if rel is None or not hasattr(rel, "vectors") or not hasattr(rel, "max_distance"):
        return {}
    blocks = range(1, len(encoder.layers) + 1) if getattr(rel, "untie_layers", False) else [1]
    with torch.no_grad():
        out = {}
        for b in blocks:
            k, v = rel.vectors(b)
            out[b] = (k.detach().double().clone(), v.detach().double().clone())
        return out


class _FirstLayerInput(Exception):
    def __init__(self, x, position_pass):
        self.x = x
        self.position_pass = position_pass


def _first_layer_input(stack, tokens: torch.Tensor, side: str):
    """What the stack's first layer receives for ``tokens``, (T, B, C), and the pass it runs in (None for fairseq's
    own position modules): the stack's own forward (embedding scale, positions, layer norm, FLOATER's solve),
    stopped at the first layer."""
    def capture(module, args):
        raise _FirstLayerInput(args[0], current_pass())

    handle = stack.layers[0].register_forward_pre_hook(capture)
    try:
        if side == "encoder":
            stack(tokens, src_lengths=torch.full((tokens.size(0),), tokens.size(1), dtype=torch.long))
        else:
            stack.extract_features(tokens, encoder_out=None)
    except _FirstLayerInput as stop:
        return stop.x, stop.position_pass
    finally:
        handle.remove()
    raise RuntimeError("the first layer was never called")


def identical_word_logits(model, token, length: int, side: str = "encoder") -> torch.Tensor:
    """Attention logits of the first layer for sequences of one repeated token (§3.1, Eq. 5):
    ā_ij = (w̄ + p_i) W^Q ((w̄ + p_j) W^K)ᵀ / √d, plus what a relative encoding adds; with the token
    fixed they depend on positions only.  ``token``: an id -> (H, L, L); a list of ids -> (N, H, L, L).
    On the decoder side the keys after the query (j > i), which it never sees, are NaN."""
    tokens = torch.as_tensor(token, dtype=torch.long)
    single = tokens.dim() == 0
    tokens = tokens.reshape(-1, 1).expand(-1, length)
    stack = side_of(model, side)
    layer = stack.layers[0]
    attn = layer.self_attn
    fast_path_off = attn.skip_embed_dim_check
    attn._set_skip_embed_dim_check()  # fairseq's fused path ignores before_softmax
    try:
        with torch.no_grad():
            x, position_pass = _first_layer_input(stack, tokens, side)
            if layer.normalize_before:
                x = layer.self_attn_layer_norm(x)
            # in the stack's pass: FLOATER's Q/K/V biases and the relative encoding's rows of these positions
            with pass_scope(position_pass):
                logits, _ = attn(query=x, key=x, value=x, key_padding_mask=None, need_weights=False,
                                 before_softmax=True)
    finally:
        attn.skip_embed_dim_check = fast_path_off
    logits = logits.view(tokens.size(0), attn.num_heads, length, length).double()
    if side == "decoder":
        logits = logits.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("nan"))
    return logits[0] if single else logits


def word_sample(dictionary, num_tokens: int, seed: int = 0, exclude=()) -> List[int]:
    """``num_tokens`` distinct random word ids (no specials, nothing in ``exclude``)."""
    excluded = set(range(dictionary.nspecial)) | set(exclude)
    words = torch.tensor([i for i in range(len(dictionary)) if i not in excluded], dtype=torch.long)
    if num_tokens < 1 or num_tokens > words.numel():
        raise ValueError(f"--num-tokens must be between 1 and the {words.numel()} words of the dictionary, "
                         f"got {num_tokens}")
    g = torch.Generator().manual_seed(seed)
    return words[torch.randperm(words.numel(), generator=g)[:num_tokens]].tolist()


def averaged_identical_word_logits(model, dictionary, length: int, num_tokens: int = 100,
                                   seed: int = 0, exclude=(), chunk: int = 8, side: str = "encoder") -> torch.Tensor:
    """Identical-word logits (H, L, L) averaged over ``num_tokens`` random words (§5.2, Fig. 3)."""
    tokens = word_sample(dictionary, num_tokens, seed, exclude)
    total = None
    for i in range(0, len(tokens), chunk):
        part = identical_word_logits(model, tokens[i:i + chunk], length, side).sum(0)
        total = part if total is None else total + part
    return total / len(tokens)
