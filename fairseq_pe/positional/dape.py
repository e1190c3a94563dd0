"""DAPE, data-adaptive positional encoding (Zheng et al. 2024, "DAPE: Data-Adaptive Positional Encoding for Length
Extrapolation", NeurIPS 2024, Eq. 4; and "DAPE V2: Process Attention Score as Feature Map for Length Extrapolation",
arXiv 2410.04798): a small network over the heads' channels of the attention logits and an additive position bias B
(ALiBi, KERPLE, FIRE, T5, Sandwich), per (query, key):

    A = Q Kᵀ/√d + B + f([Q Kᵀ/√d ; B])                      X = [logits ; B]: 2H channels per (i, j)
    v1 (``--pe-dape v1``):  f = W₂ · act(W₁ · X_ij + b₁) + b₂   over the channels of each (i, j) alone
    v2 (``--pe-dape v2``):  f = Conv₂ ∘ act ∘ Conv₁ (X)         two 1×k convolutions along the keys of each query row

a modifier of the side's ``--pe-relative`` bias (refused by name with an encoding that has none: RoPE, the Shaw
family, FoX, CoPE).  As the reference (``chuanyang-Zheng/DAPE`` @ bde344a: ``DAPE.py``'s ``AliBi_DAPE``,
``ParallelKerpleLog_DAPE``, ``FIRE_DAPE``; ``megatron/model/positional_embeddings.py``'s ``Alibi_DAPEV2``,
``Kerple_DAPEV2``, ``FIRE_DAPEV2``; ``megatron/model/transformer.py`` applies them to the unmasked, already scaled
scores before the mask and the softmax): the network mixes the heads (each output head reads every head's logit and
bias), width 32 (``--pe-dape-width``), LeakyReLU of slope 0.01 (``--pe-dape-activation``), PyTorch's default
``nn.Linear`` / ``nn.Conv2d`` initialisation (so f is not 0 at initialisation), one network per layer, B added
unscaled after the logits' 1/√d, kernel 3 with zero padding on both sides of the keys for v2
(``--pe-dape-kernel``).  Everything runs in float32 (float64 in a float64 model).

The bias B is the encoding's own, as it is without DAPE: in the decoder the reference's ALiBi and KERPLE take
``-tril(i - j)`` (0 above the diagonal), ours their value at |i − j| there; v1 reads each (i, j) alone, so the
masked entries change nothing.  In the encoder (bidirectional, which the papers do not define) B is the encoding's
bidirectional bias and f the same network.

v2 and the future keys.  The reference zeroes X above the diagonal (``torch.tril``) before the convolutions, so no
future logit is read; but the first convolution's outputs at the key positions after the query (its bias, and the
last visible keys' logits) reach the second one, and they exist only where the sequence goes on: in the reference a
row's last entries depend on how many keys follow it (the last row, which has none, gets the second convolution's
zero padding there instead), and its step-by-step decoding (``sq == 1``, whose ``tril`` of a 1-row tensor keeps key 0
only) computes something else again.  Here each causal row is computed as if at least k//2 keys followed it (X gets
k//2 zero columns on the right): every row then depends on its own visible keys only, as in the reference for every
row that has k//2 keys after it, and step-by-step decoding equals the full pass.  Hidden keys of X (future and
padding) are 0, as the reference's tril; the first convolution's outputs at padding keys are 0 too (as the
convolution's own zero padding at the ends of an unpadded row): in the decoder those before the query (its keys after
the query are its future, continued as above), in the encoder every one, before or after the query, so that neither
left nor right padding changes a real token's logits.  The reference (a causal language model, unpadded batches)
has no padding to mask.
"""


import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_pe.errors import UserError

from .base import Float32State, RelativePositionEncoding, compute_dtype, option, query_key_products
from .pass_state import HiddenKeysKey, as_rows

WIDTH = 32
KERNEL = 3
ACTIVATIONS = {"leaky-relu": F.leaky_relu, "relu": F.relu, "gelu": F.gelu}
VERSIONS = ("v1", "v2")


def with_dape(relative, args):
    """The side's relative encoding modified by DAPE where ``--pe-dape`` asks for it (else as it is)."""
    version = getattr(args, "pe_dape", None) or "none"
    if version == "none":
        return relative
    if relative is None or not relative.adds_bias or relative.own_logits:
        name = "none" if relative is None else relative.registry_name
        raise UserError(f"--pe-dape {version} needs an additive position bias B to feed its network with the logits "
                        f"(--pe-relative alibi, kerple-log, kerple-power, fire, t5 or sandwich): --pe-relative {name} "
                        "has none; choose one of those or remove --pe-dape")
    return DapeModifier(relative, version, args)


class DapeModifier(Float32State, RelativePositionEncoding):
    """The encoding ``base`` with DAPE's network over [logits; B] (module docstring); its parameters are the
    base's, under ``base.``, and one network per layer."""

    own_logits = True
    untiable = ("layers", "heads")  # the untie flags are the base encoding's, checked when it was built

    def __init__(self, base: RelativePositionEncoding, version: str, args=None):
        super().__init__(base.embed_dim, base.num_heads, base.num_blocks, base.causal, args)
        if version not in VERSIONS:
            raise UserError(f"--pe-dape must be one of none, {', '.join(VERSIONS)}, got {version}")
        self.base = base
        self.registry_name = f"{base.registry_name} with --pe-dape {version}"
        self.version = version
        self.needs_positions = base.needs_positions
        self.width = option(args, "pe_dape_width", WIDTH)
        if self.width < 1:
            raise UserError(f"--pe-dape-width must be at least 1, got {self.width}")
        activation = option(args, "pe_dape_activation", "leaky-relu")
        if activation not in ACTIVATIONS:
            raise UserError(f"--pe-dape-activation must be one of {', '.join(ACTIVATIONS)}, got {activation}")
        self.activation = ACTIVATIONS[activation]
        self.kernel = option(args, "pe_dape_kernel", KERNEL) if version == "v2" else 1
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise UserError(f"--pe-dape-kernel must be an odd number of keys (1, 3, 5, ...), got {self.kernel}")
        heads = base.num_heads
        # nn.Linear / nn.Conv2d per layer, stacked (their own initialisation, as the reference)
        if version == "v1":
            layers = [(nn.Linear(2 * heads, self.width), nn.Linear(self.width, heads)) for _ in range(base.num_blocks)]
        else:
            layers = [(nn.Conv2d(2 * heads, self.width, (1, self.kernel)),
                       nn.Conv2d(self.width, heads, (1, self.kernel)))
                      for _ in range(base.num_blocks)]
        self.w1 = nn.Parameter(torch.stack([a.weight.detach() for a, _ in layers]))
        self.b1 = nn.Parameter(torch.stack([a.bias.detach() for a, _ in layers]))
        self.w2 = nn.Parameter(torch.stack([b.weight.detach() for _, b in layers]))
        self.b2 = nn.Parameter(torch.stack([b.bias.detach() for _, b in layers]))

    def rotate(self, q, k, query_offset, block, query_scale=1.0, rows=None):
        return self.base.rotate(q, k, query_offset, block, query_scale, rows=rows)

    def bias_key(self, block):
        return self.base.bias_key(block)

    def attention_logits(self, q, k, query_offset, block, rows=None, state=None, masking=None):
        """logits + B + f([logits; B]) in float32 (module docstring), for the scaled queries ``q`` (B, H, T', d)."""
        logits = query_key_products(q, k).to(compute_dtype(q.dtype))  # (B, H, T', S): scaled, unmasked
        count, src_len = logits.shape[-2:]
        bias = self.base.position_bias(count, src_len, query_offset, block, rows=rows).to(logits)  # (H|B·H, T', S)
        index = block - 1
        if self.version == "v1":
            network = self._pointwise(logits, bias, index)
        else:
            hidden = as_rows(rows).shared(HiddenKeysKey(logits.size(0), count, src_len, query_offset,
                                                        None if masking is None else tuple(masking.shape)),
                                          lambda: self._hidden_keys(count, src_len, query_offset, masking, logits))
            network = self._convolved(logits, bias, index, hidden)
        return network.add_(logits).add_(bias)

    def _hidden_keys(self, count, src_len, query_offset, masking, logits):
        """v2's masks, which depend on the positions and the step's masks only (once per pass or step, not per
        layer): the keys zeroed before the first convolution (future and padding; None: none) and the hidden
        units zeroed after it (padding keys and the k//2 extra keys; None: none)."""
        keys = torch.arange(src_len, device=logits.device)
        rows = torch.arange(query_offset, query_offset + count, device=logits.device).unsqueeze(1)  # (T', 1)
        hidden_keys = None if masking is None else masking != 0  # (B|1, 1, T', S): future and padding
        if self.causal:  # the future is hidden whatever the caller's masks, as the reference's tril
            future = keys > rows
            hidden_keys = future if hidden_keys is None else hidden_keys | future
        hidden_units = None
        if masking is not None:  # padding keys: 0, as the zero padding at the ends of an unpadded row
            padding = masking != 0  # the encoder's hidden keys: padding, before or after the query
            if self.causal:  # the decoder's keys after the query are its future, continued as if zero keys followed
                padding = padding & (keys < rows)
            after = padding.new_zeros(padding.shape[:-1] + (self.kernel // 2 if self.causal else 0,))  # k//2 extra
            hidden_units = torch.cat([padding, after], dim=-1)
        return hidden_keys, hidden_units

    def _pointwise(self, logits, bias, index):
        """v1: f over the channels of each (i, j); the bias's share of the first layer computed once for the batch
        (for one query row, a decoding step, one product over [logits; bias], with fewer operators)."""
        heads = self.num_heads
        bsz, _, count, src_len = logits.shape
        if count == 1:
            # channels last as the concatenation writes them: the product reads them in place, no copy per layer
            features = torch.cat([logits.movedim(1, -1),
                                  bias.reshape(-1, heads, count, src_len).expand(bsz, -1, -1, -1).movedim(1, -1)],
                                 dim=-1)
            hidden = F.linear(features, self.w1[index], self.b1[index])  # (B, 1, S, width)
            return F.linear(self.activation(hidden), self.w2[index], self.b2[index]).movedim(-1, 1)
        w1 = self.w1[index]
        hidden = F.linear(logits.movedim(1, -1), w1[:, :heads])  # (B, T', S, width)
        hidden = hidden + F.linear(bias.movedim(-3, -1), w1[:, heads:], self.b1[index])  # (.., T', S, width)
        return F.linear(self.activation(hidden), self.w2[index], self.b2[index]).movedim(-1, 1)

    def _convolved(self, logits, bias, index, hidden):
        """v2: two 1×k convolutions along the keys of each row, hidden keys zeroed (module docstring); ``hidden``:
        :meth:`_hidden_keys`."""
        bsz, heads, count, src_len = logits.shape
        hidden_keys, hidden_units = hidden
        features = torch.cat([logits, bias.expand(bsz, heads, count, src_len)], dim=1)  # (B, 2H, T', S)
        pad = self.kernel // 2
        if hidden_keys is not None:
            features = features.masked_fill(hidden_keys, 0.0)
        if self.causal:  # as if k//2 keys followed every row (module docstring)
            features = F.pad(features, (0, pad))
        hidden = self.activation(F.conv2d(features, self.w1[index], self.b1[index], padding=(0, pad)))
        if hidden_units is not None:
            hidden = hidden.masked_fill(hidden_units, 0.0)
        return F.conv2d(hidden, self.w2[index], self.b2[index], padding=(0, pad))[..., :src_len]
