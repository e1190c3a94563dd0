"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer Eq. 34), and its context extension at inference.

Queries and keys of each head are rotated pairwise by angles proportional to their index:
q_m ↦ R(m)q_m, k_n ↦ R(n)k_n with R(m) = diag of 2×2 rotations by m·θ_i, θ_i = 10000^(−2i/d),
so that ⟨R(m)q, R(n)k⟩ depends on m − n only.  The rotation is done by the
``rotary-embedding-torch`` library, in float32 from float32 frequencies also in an fp16/bf16
model (the library's frequencies and cache are kept float32, :class:`~.base.Float32State`).  Cached keys are
stored rotated, so step-by-step decoding rotates only the new query and key.  No parameters,
no length limit.

Context extension (``--pe-rope-scaling``, factor s = ``--pe-rope-scaling-factor``), usable on a trained
checkpoint at generation time (``--model-overrides "{'pe_rope_scaling': 'ntk', 'pe_rope_scaling_factor': 4}"``):

* ``linear``: Position Interpolation (Chen et al. 2023), R(m/s): positions are divided by s;
* ``ntk``: NTK-aware scaling (bloc97 2023): the base 10000 becomes 10000·s^(d/(d−2)), which stretches the
  low frequencies by about s and leaves the highest one unchanged;
* ``yarn``: YaRN (Peng et al. 2023, §3.2–3.4, "NTK-by-parts" plus temperature).  With the training length L
  (``--pe-rope-scaling-original-length``) and r_i = L/λ_i the number of turns of frequency θ_i (wavelength
  λ_i = 2π/θ_i) within it, θ'_i = (1 − γ(r_i))·θ_i/s + γ(r_i)·θ_i, where the ramp γ is 0 below α = 1 turn
  (interpolated, as PI), 1 above β = 32 turns (kept) and linear in the dimension index between (the reference
  implementation's rounding of the boundaries); the attention logits are multiplied by 1/t with
  √(1/t) = 0.1·ln s + 1 (queries and keys each times √(1/t)).  With L ≤ 6 every frequency has fewer than one
  turn (the fastest's wavelength is 2π), so every pair is interpolated, as the paper's rule says; Hugging Face's
  ``_compute_yarn_parameters`` ramp, clamped in dimension indices, interpolates none there (at the longer
  training lengths where the two were compared, their frequencies agree within 6e-8).

``--pe-rerope-window W`` caps the relative position at W at inference, ReRoPE (Su 2023, :mod:`.rerope`).
``--pe-rope-resonance`` rounds every (scaled) frequency to a whole wavelength, Resonance RoPE (Wang et al. 2024,
:mod:`.resonance_rope`), in training or with any of these at generation time; ``--pe-relative p-rope`` rotates only
the highest-frequency share of the pairs (:mod:`.partial_rotary`).

The frequencies are a function of these options only.  The library keeps them as a (frozen) parameter,
so checkpoints hold a copy; loading ignores it and keeps the model's own (:meth:`_load_from_state_dict`),
so that a scaling given at load time is not overwritten by the unscaled copy.
"""

import math

import torch
from rotary_embedding_torch import RotaryEmbedding

from fairseq_pe.errors import UserError

from .base import Float32State, RelativePositionEncoding, compute_dtype, register_position_encoding
from .pass_state import RelativeRows, RotationKey, as_rows
from .rerope import rerope_logits
from .resonance_rope import resonance_angles, resonance_frequencies, resonance_wavelengths

SCALINGS = ("none", "linear", "ntk", "yarn")
#: YaRN's α and β: frequencies with fewer than α turns in the training length are interpolated, more than β kept
YARN_ALPHA, YARN_BETA = 1.0, 32.0


def yarn_frequencies(dim: int, factor: float, original_length: int, base: float = 10000.0) -> torch.Tensor:
    """θ'_i of YaRN's NTK-by-parts interpolation (module docstring), float32."""
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)

    def index_with_turns(turns):  # the (fractional) dimension index i where L/λ_i = turns
        return dim * math.log(original_length / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(index_with_turns(YARN_BETA)), 0)
    high = min(math.ceil(index_with_turns(YARN_ALPHA)), dim - 1)
    if high <= low:
        high = low + 1e-3
    interpolated = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return (theta * (1 - interpolated) + theta / factor * interpolated).float()


def yarn_scale(factor: float) -> float:
    """√(1/t) = 0.1·ln s + 1: each of queries and keys is multiplied by it."""
    return 0.1 * math.log(factor) + 1.0


#: how to set the scaling options of a trained checkpoint (they are stored in it)
OVERRIDE_HINT = ("on a trained checkpoint, override them together, e.g. --model-overrides \"{'pe_rope_scaling': "
                 "'none', 'pe_rope_scaling_factor': None, 'pe_rope_scaling_original_length': None}\"")


def _number(value, flag: str, cast):
    """``value`` as a number of type ``cast`` (``--model-overrides`` may give a string such as '4'), or an error
    naming the flag."""
    if value is None or isinstance(value, bool):
        return None if value is None else cast(value)
    try:
        number = cast(value)
    except (TypeError, ValueError):
        raise UserError(f"{flag}: a number is needed, got {value!r}") from None
    if cast is int and float(value) != number:
        raise UserError(f"{flag}: a whole number is needed, got {value!r}")
    return number


def rerope_options(args):
    """(window, training length, leaky factor) of ReRoPE (:mod:`.rerope`), (None, None, None) without it."""
    window = _number(getattr(args, "pe_rerope_window", None), "--pe-rerope-window", int)
    length = _number(getattr(args, "pe_rerope_train_length", None), "--pe-rerope-train-length", int)
    factor = _number(getattr(args, "pe_rerope_leaky_factor", None), "--pe-rerope-leaky-factor", float)
    if window is None:
        given = [flag for flag, value in (("--pe-rerope-train-length", length), ("--pe-rerope-leaky-factor", factor))
                 if value is not None]
        if given:
            raise UserError(f"{' and '.join(given)} {'need' if len(given) > 1 else 'needs'} --pe-rerope-window W "
                            "(ReRoPE's window): give it, or remove them")
        return None, None, None
    if window < 1:
        raise UserError(f"--pe-rerope-window must be at least 1 (the relative positions kept), got {window}")
    if length is None or length < 2:
        raise UserError("--pe-rerope-window needs --pe-rerope-train-length L, the longest sequence the model was "
                        "trained on, at least 2 (queries are scaled by max(1, log(i + 1)/log L), as the reference), "
                        f"got {length}")
    if factor is not None and not (math.isfinite(factor) and factor > 1):
        raise UserError(f"--pe-rerope-leaky-factor must be a number above 1 (the slope 1/K past the window; "
                        f"without it: ReRoPE), got {factor}")
    return window, length, factor


def rope_scaling(args):
    """(kind, factor) from the model's options; ("none", 1) without them."""
    kind = getattr(args, "pe_rope_scaling", None) or "none"
    factor = _number(getattr(args, "pe_rope_scaling_factor", None), "--pe-rope-scaling-factor", float)
    length = _number(getattr(args, "pe_rope_scaling_original_length", None), "--pe-rope-scaling-original-length", int)
    if kind not in SCALINGS:
        raise UserError(f"--pe-rope-scaling {kind!r}: choose one of {', '.join(SCALINGS)}")
    if kind == "none":
        given = [flag for flag, value in (("--pe-rope-scaling-factor", factor),
                                          ("--pe-rope-scaling-original-length", length)) if value is not None]
        if given:
            raise UserError(f"{' and '.join(given)} {'need' if len(given) > 1 else 'needs'} --pe-rope-scaling linear, "
                            f"ntk or yarn: remove {'them' if len(given) > 1 else 'it'} or choose a scaling; "
                            f"{OVERRIDE_HINT}")
        return kind, 1.0
    if factor is None or not math.isfinite(factor) or factor < 1:
        raise UserError(f"--pe-rope-scaling {kind} needs --pe-rope-scaling-factor S, finite and at least 1 (the ratio "
                        f"of the length to reach to the training length), got {factor}")
    if kind == "yarn" and (length is None or length < 1):
        raise UserError("--pe-rope-scaling yarn needs --pe-rope-scaling-original-length N, the longest sequence "
                        f"the model was trained on (in tokens), got {length}")
    if kind != "yarn" and length is not None:
        raise UserError(f"--pe-rope-scaling-original-length is used by --pe-rope-scaling yarn only, not {kind}; "
                        f"remove it ({OVERRIDE_HINT})")
    return kind, float(factor)


@register_position_encoding("relative", "rope")
class RotaryPositionEncoding(Float32State, RelativePositionEncoding):
    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        if self.head_dim % 2 or self.head_dim < 4:
            raise UserError(f"--pe-relative {self.registry_name} needs an even head dimension of at least 4 (pairs of "
                            f"dimensions rotate; rotary-embedding-torch divides by d − 2), got {self.head_dim} "
                            f"({embed_dim} dimensions / {num_heads} heads): use fewer heads or more dimensions")
        self.scaling, self.factor = rope_scaling(args)
        yarn = self.scaling == "yarn"
        self.rotary = RotaryEmbedding(
            dim=self.head_dim,
            custom_freqs=yarn_frequencies(self.head_dim, self.factor,
                                          _number(args.pe_rope_scaling_original_length, "", int))
            if yarn else None,
            interpolate_factor=self.factor if self.scaling == "linear" else 1.0,
            theta_rescale_factor=self.factor if self.scaling == "ntk" else 1.0,
            # no angle cache: the library keeps it in a buffer, which DDP's --broadcast-buffers overwrites with
            # rank 0's while the cached length (a plain attribute) stays each rank's own; an empty one costs nothing
            cache_if_possible=False, cache_max_seq_len=0)
        self.qk_scale = yarn_scale(self.factor) if yarn else 1.0
        #: Resonance RoPE (``--pe-rope-resonance``, :mod:`.resonance_rope`): the scaled frequencies rounded to whole
        #: wavelengths, PI's factor folded into them (positions stay integers)
        self.resonance = bool(getattr(args, "pe_rope_resonance", None))
        pairs = self.rotated_pairs(args)
        with torch.no_grad():
            if self.resonance:
                wavelengths = resonance_wavelengths(self.rotary.freqs / self.rotary.interpolate_factor)
                self.rotary.freqs.copy_(resonance_frequencies(wavelengths))
                self.rotary.interpolate_factor = 1.0
            self.rotary.freqs[pairs:] = 0  # p-RoPE's unrotated pairs
        if self.resonance:  # the periods of the angles (t mod λ̃)·θ̃; 1 for the unrotated pairs (any finite value)
            self.register_buffer("periods", wavelengths.masked_fill(self.rotary.freqs == 0, 1.0), persistent=False)
        self.rerope_window, self.rerope_train_length, self.rerope_leaky_factor = rerope_options(args)
        if self.rerope_window is not None:
            # ReRoPE (:mod:`.rerope`): the attention takes its logits from rerope_logits (the logits hook), the
            # keys are cached unrotated, and the log scaling reads the absolute positions (not the indices)
            self.own_logits = True
            self.needs_positions = True

    def rotated_pairs(self, args) -> int:
        """How many pairs of dimensions rotate, those of highest frequency (p-RoPE's floor(p·d/2)): all here."""
        return self.head_dim // 2

    def query_positions(self, length: int, query_offset: int, device, rows: RelativeRows = None):
        """The positions of the pass's new queries (and keys): (B, T) from the rows' own positions
        (randomised), else None (the indices query_offset .. query_offset + T − 1)."""
        positions = as_rows(rows).positions
        if positions is None:
            return None
        return positions[:, query_offset:query_offset + length].to(device)

    def rotations(self, length: int, query_offset: int, device, query_scale: float = 1.0, rows: RelativeRows = None):
        """The rotations of the pass's new queries (times ``query_scale``) and keys, complex (T, d/2), or
        (B, 1, T, d/2) for rows with positions of their own: computed once per pass (or decoding step) and shared by
        the side's layers."""
        rows = as_rows(rows)
        positions = self.query_positions(length, query_offset, device, rows)

        def compute():
            rotate_q, rotate_k = self._rotations(length, query_offset, positions, device, rows)
            return (rotate_q if query_scale == 1.0 else rotate_q * query_scale), rotate_k

        return rows.shared(RotationKey(length, query_offset, positions is not None, query_scale), compute)

    def _rotations(self, length, query_offset, positions, device, rows):
        """R(m) as complex numbers per frequency pair, e^(i·m·θ) times the queries' and keys' scale (YaRN's)."""
        angles = self.angles(length, query_offset, positions, device)
        scale = torch.full_like(angles, self.qk_scale)
        rotation = torch.polar(scale, angles)
        return rotation, rotation

    def angles(self, length, query_offset, positions, device):
        """m·θ_i for the pass's new positions m (float32, float64 in a float64 model): the library's frequencies and
        position interpolation, (T, d/2), or (B, 1, T, d/2) for positions per row."""
        dtype = compute_dtype(self.rotary.freqs.dtype)
        if positions is None:  # as rotary-embedding-torch's get_seq_pos: (arange + offset) / factor
            t = (torch.arange(length, device=device, dtype=dtype) + query_offset)
        else:
            t = positions.to(dtype).unsqueeze(1)
        return self.angles_of(t)

    def angles_of(self, t: torch.Tensor) -> torch.Tensor:
        """m·θ_i of the positions ``t`` (..., T) float32: (..., T, d/2)."""
        if self.resonance:
            return resonance_angles(t, self.rotary.freqs, self.periods)
        return (t / self.rotary.interpolate_factor).unsqueeze(-1) * self.rotary.freqs  # its einsum, one product

    def rotation_at(self, t: torch.Tensor) -> torch.Tensor:
        """R(t) of the positions ``t`` (..., T) float32 (any real number), complex (..., T, d/2), times YaRN's
        scale of queries and keys."""
        angles = self.angles_of(t)
        return torch.polar(torch.full_like(angles, self.qk_scale), angles)

    @staticmethod
    def rotated_by(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
        """``x`` (..., T, d) times ``rotation`` (..., T, d/2) pair by pair, in float32, in ``x``'s dtype."""
        return rotated(x, rotation, x.dtype)

    def rotated_dtype(self, dtype, length, query_offset, rows=None):
        return dtype

    def rotate(self, q, k, query_offset, block, query_scale=1.0, rows=None):
        # q, k: (B, H, T, d); new keys sit at the same indices as the queries.  Each pair of dimensions (2i, 2i+1)
        # rotates by m·θ_i (rotary-embedding-torch's layout): a complex product, computed in float32
        if self.rerope_window is not None:  # ReRoPE rotates in attention_logits; keys are cached unrotated
            return (q if query_scale == 1.0 else q * query_scale), k
        rotate_q, rotate_k = self.rotations(q.size(-2), query_offset, q.device, query_scale, rows)
        dtype = self.rotated_dtype(q.dtype, q.size(-2), query_offset, rows)
        return rotated(q, rotate_q, dtype), rotated(k, rotate_k, dtype)

    def attention_logits(self, q, k, query_offset, block, rows=None, state=None, masking=None):
        if self.rerope_window is None:
            return super().attention_logits(q, k, query_offset, block, rows, state, masking)
        return rerope_logits(self, q, k, query_offset, rows)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # the checkpoint's copy of the frequencies is replaced by this model's (its scaling may differ)
        key = prefix + "rotary.freqs"
        if key in state_dict:
            state_dict[key] = self.rotary.freqs.detach().clone()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


def rotated(x: torch.Tensor, rotation: torch.Tensor, dtype) -> torch.Tensor:
    """``x`` (..., T, d) with each pair of dimensions (2i, 2i+1), read as a complex number, times ``rotation``
    (..., T, d/2), in float32 (float64 for a float64 ``x``): x₂ᵢ·cos − x₂ᵢ₊₁·sin and x₂ᵢ·sin + x₂ᵢ₊₁·cos times the
    rotation's magnitude, which is rotary-embedding-torch's ``apply_rotary_emb`` (``t·cos + rotate_half(t)·sin``) in
    three operations."""
    pairs = torch.view_as_complex(x.to(compute_dtype(x.dtype)).unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * rotation).flatten(-2).to(dtype)


#: xPos's γ and B (Sun et al. 2022, §3.2: ζ_i = (2i/d + γ)/(1 + γ), scale base B = 512)
XPOS_GAMMA, XPOS_SCALE_BASE = 0.4, 512.0
#: positions from which xPos's scaled queries and keys are kept in float32 in an fp16 model: the smallest
#: ζ (γ/(1 + γ)) to the power −m/B passes 2^8 there, which leaves fp16 (max 65504) a margin of 2^8 for the key
FP16_SCALED_LENGTH = int(XPOS_SCALE_BASE * math.log(2 ** 8) / -math.log(XPOS_GAMMA / (1 + XPOS_GAMMA)))


@register_position_encoding("relative", "xpos")
class XposPositionEncoding(RotaryPositionEncoding):
    """xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", Eq. 9–10): RoPE whose query at position n
    and key at position m are also scaled per frequency pair i, q_n·ζ_i^(n/B) and k_m·ζ_i^(−m/B), so that their
    product carries ζ_i^((n−m)/B), an exponential decay with the distance, faster for the high frequencies
    (ζ_i = (2i/d + 0.4)/1.4 < 1, B = 512).

    It is defined for causal attention (n ≥ m): the decoder's self-attention.  In the encoder the same
    factor would grow without bound towards the keys to the right of a query (n − m < 0), and a symmetric
    ζ^(|n−m|/B) cannot be split into a query and a key factor, so the encoder uses plain RoPE.  The scales use
    absolute positions (not centred on the sequence as in torchscale, which re-rotates its whole key cache at
    every step): cached keys keep their scale, so step-by-step decoding equals the full pass.  In float32
    that bounds the length: ζ_0^(−m/B) overflows near m = 35,000; longer sequences are refused, never clamped.
    In an fp16 model the scaled keys would overflow from about 3,500 positions: from
    :data:`FP16_SCALED_LENGTH` (2,266) on, the scaled queries and keys stay float32 (bf16 has float32's range),
    also under autocast (``--amp``), whose fp16 SDPA and ``bmm`` would cast them back: their attention runs with
    autocast off (:func:`~fairseq_pe.models.attention.autocast_off`).
    """

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        d = self.head_dim
        zeta = (torch.arange(0, d, 2, dtype=torch.float64) / d + XPOS_GAMMA) / (1 + XPOS_GAMMA)
        self.register_buffer("log_zeta", zeta.log().float(), persistent=False)  # per frequency pair
        self.max_length = int(80 / (-float(zeta.log().min())) * XPOS_SCALE_BASE)  # |exponent| <= 80 < ln(3.4e38)

    def last_position(self, length, query_offset, rows: RelativeRows = None) -> int:
        """The largest position of the pass's new queries, known without reading the positions (no host sync)."""
        rows = as_rows(rows)
        if rows.positions is None:
            return query_offset + length - 1
        return rows.bound - 1  # the rows' own positions: below their bound

    def rotated_dtype(self, dtype, length, query_offset, rows=None):
        # in fp16 the key's scale ζ^(−m/B) times the key leaves the range from a few thousand positions (and the
        # query's underflows): past FP16_SCALED_LENGTH the scaled queries and keys stay float32 (the attention
        # then runs in float32; cached keys of earlier steps are promoted); bf16 has float32's range
        if not self.causal or dtype != torch.float16:
            return dtype
        return torch.float32 if self.last_position(length, query_offset, rows) >= FP16_SCALED_LENGTH else dtype

    def _rotations(self, length, query_offset, positions, device, rows):
        angles = self.angles(length, query_offset, positions, device)
        if not self.causal:  # the encoder: plain RoPE (class docstring)
            rotation = torch.polar(torch.ones_like(angles), angles)
            return rotation, rotation
        last = self.last_position(length, query_offset, rows)
        if last >= self.max_length:
            raise UserError(f"--pe-relative xpos: position {last} is beyond the {self.max_length} positions whose "
                            "scales float32 can hold; use --pe-relative rope for longer sequences")
        if positions is None:
            positions = torch.arange(query_offset, query_offset + length, device=device)
        else:  # the rows' own positions: (B, 1, T) (padding's −1 gets a harmless scale; it is masked)
            positions = positions.unsqueeze(1)
        exponent = positions.to(self.log_zeta.dtype).unsqueeze(-1) / XPOS_SCALE_BASE * self.log_zeta  # (..., T, d/2)
        # the queries' rotation scaled by ζ^(n/B), the keys' by ζ^(−m/B)
        return torch.polar(exponent.exp(), angles), torch.polar((-exponent).exp(), angles)
