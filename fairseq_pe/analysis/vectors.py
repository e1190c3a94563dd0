"""Position vectors and identical-word attention logits of a model (Wang et al. 2021, §3.1, §5.2).

Works for ``transformer_pe`` and ``roberta_pe`` models (every ``--pe-*`` encoding, FLOATER
included) and for fairseq's stock ``transformer``/``roberta`` (sinusoidal or learned positions).
"""

from typing import Dict, List, Optional, Tuple

import torch

from fairseq_pe.models.floater_setup import floater_pass
from fairseq_pe.positional.injector import PositionInjector


def encoder_of(model):
    """The Transformer encoder holding the positions: RoBERTa's sentence encoder, or the encoder."""
    encoder = model.encoder
    return getattr(encoder, "sentence_encoder", encoder)


def _flow(injector) -> Optional[object]:
    if not isinstance(injector, PositionInjector):
        return None
    for client in (injector.absolute, injector.self_bias):
        flow = getattr(client, "flow", None)
        if flow is not None:
            return flow
    return None


def absolute_vectors(model, length: int) -> Dict[int, torch.Tensor]:
    """Block -> (length, D) absolute vectors of the encoder (only block 1 unless every block has its
    own); empty without an absolute encoding."""
    encoder = encoder_of(model)
    injector = encoder.embed_positions
    if injector is None:
        return {}
    with torch.no_grad():
        if isinstance(injector, PositionInjector):
            if injector.absolute is None:
                return {}
            blocks = range(1, len(encoder.layers) + 1) if injector.all_blocks else [1]
            with floater_pass(_flow(injector), length):
                return {b: injector.absolute(length, b).detach().double().clone() for b in blocks}
        # fairseq's own modules (offsets by padding_idx + 1 internally)
        pad = encoder.padding_idx
        tokens = torch.full((1, length), pad + 1, dtype=torch.long)
        return {1: injector(tokens)[0].detach().double().clone()}


def relative_vectors(model) -> Dict[int, Tuple[torch.Tensor, torch.Tensor]]:
    """Block -> (a^K, a^V) of a vector-valued relative encoding, each (2K+1, d) or (H, 2K+1, d), index
    r + K for the distance r = j - i; block 1 only when the blocks share them (the default); empty
    for other encodings (RoPE, ALiBi, T5 act on the logits only: see :func:`identical_word_logits`)."""
    encoder = encoder_of(model)
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


def identical_word_logits(model, token, length: int) -> torch.Tensor:
    """Attention logits of the first layer for sequences of one repeated token (§3.1, Eq. 5):
    ā_ij = (w̄ + p_i) W^Q ((w̄ + p_j) W^K)ᵀ / √d, plus what a relative encoding adds; with the token
    fixed they depend on positions only.  ``token``: an id -> (H, L, L); a list of ids -> (N, H, L, L)."""
    tokens = torch.as_tensor(token, dtype=torch.long)
    single = tokens.dim() == 0
    tokens = tokens.reshape(-1, 1).expand(-1, length)
    encoder = encoder_of(model)
    layer = encoder.layers[0]
    attn = layer.self_attn
    fast_path_off = attn.skip_embed_dim_check
    attn._set_skip_embed_dim_check()  # fairseq's fused path ignores before_softmax
    try:
        with torch.no_grad(), floater_pass(_flow(encoder.embed_positions), length):
            x, _ = encoder.forward_embedding(tokens)
            x = x.transpose(0, 1)
            if layer.normalize_before:
                x = layer.self_attn_layer_norm(x)
            logits, _ = attn(query=x, key=x, value=x, key_padding_mask=None, need_weights=False,
                             before_softmax=True)
    finally:
        attn.skip_embed_dim_check = fast_path_off
    logits = logits.view(tokens.size(0), attn.num_heads, length, length).double()
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
                                   seed: int = 0, exclude=(), chunk: int = 8) -> torch.Tensor:
    """Identical-word logits (H, L, L) averaged over ``num_tokens`` random words (§5.2, Fig. 3)."""
    tokens = word_sample(dictionary, num_tokens, seed, exclude)
    total = None
    for i in range(0, len(tokens), chunk):
        part = identical_word_logits(model, tokens[i:i + chunk], length).sum(0)
        total = part if total is None else total + part
    return total / len(tokens)
