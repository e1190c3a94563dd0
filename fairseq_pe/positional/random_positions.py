"""Randomised positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length Generalization of
Transformers", §3): ``--pe-random-positions L`` gives the n tokens of a sequence an ordered random subset of
n positions drawn uniformly from [0, L), instead of 0 .. n−1, so that a model trained on short sequences has
seen every position (and distance) up to L and a longer test input stays in distribution.  Every encoding that
takes integer positions uses them: the absolute tables and sinusoids, RoPE and xPos, and the relative biases
and vectors, whose distances become those of the sampled positions.

Each row draws its own subset (the official code draws one per batch; here rows of different lengths get a
uniform subset of their own size, and padding takes no position).  Training samples at every forward pass.
Evaluation follows the paper (whose code samples at test time too) where fairseq allows it: the encoder side
gets a random subset as in training, drawn from keys hashed from the sentence's tokens on the device
(:func:`_keys_seeded_by_tokens`), so that a sentence has the same positions whatever its batch, seed, beam or
device, and ``fairseq-generate``'s scores are reproducible; the decoder uses 0 .. n−1 by default, because
step-by-step generation cannot draw an ordered subset whose size is not yet known, and its full passes
(``--score-reference``, validation) must give the scores of generation.
``--pe-random-eval-decoder spaced`` gives it instead the positions that training draws on average for a target
as long as the source (:func:`spaced_positions`): 0 .. n−1 is a configuration that training draws with
probability 1/C(L, n), while training's neighbours are (L+1)/(n+1) apart on average.  L bounds
the lengths: a longer sequence has no n distinct positions in [0, L), so the model's ``max_positions`` is at
most L and fairseq refuses longer inputs by name.
"""

import functools

import torch

from fairseq_pe.errors import UserError


#: the most random keys drawn at once (rows × L)
KEY_ELEMENTS = 1 << 22


#: MurmurHash3's 32-bit finaliser ``fmix32`` (Appleby, MurmurHash3.cpp) and the golden-ratio Weyl increment that
#: SplitMix adds to its counter (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number generators")
FMIX32_MULTIPLIERS, WEYL32 = (0x85EBCA6B, 0xC2B2AE35), 0x9E3779B9
LOW32 = 0xFFFFFFFF


def _times32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """x · ``constant`` mod 2³² for int64 x in [0, 2³²) and a 32-bit constant, exactly, without overflowing
    int64 (the constant in 16-bit halves: each product stays below 2⁴⁸), so that the CPU and CUDA give the same
    bits."""
    return (x * (constant & 0xFFFF) + ((x * (constant >> 16)) & 0xFFFF) * 0x10000) & LOW32


def fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finaliser on int64 values in [0, 2³²): a bijection of 32-bit words whose output bits each
    depend on every input bit (xor-shifts and two multiplications, as ``fmix32`` in MurmurHash3.cpp)."""
    x = x ^ (x >> 16)
    x = _times32(x, FMIX32_MULTIPLIERS[0])
    x = x ^ (x >> 13)
    x = _times32(x, FMIX32_MULTIPLIERS[1])
    return x ^ (x >> 16)


def sentence_hashes(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B,) 32-bit hash (int64) of each row's real tokens in their order: the sum mod 2³² of fmix32 of each token
    plus its index's hash (``positions``: 0 .. n−1 at the real tokens, −1 at padding, as :func:`sample_positions`
    takes them), finalised with the length.  Padding, its side and the batch's width do not enter; computed with
    tensor operations on the tokens' device (no host sync)."""
    real = positions.ge(0)
    index = positions.clamp(min=0)
    elements = fmix32(((tokens.long() & LOW32) + fmix32((index + 1) * WEYL32 & LOW32)) & LOW32)
    total = torch.where(real, elements, 0).sum(dim=1) + real.sum(dim=1) * WEYL32  # < 2⁵⁷: T ≤ L ≤ 2²⁴
    return fmix32(total & LOW32)


def _keys_seeded_by_tokens(tokens: torch.Tensor, positions: torch.Tensor, limit: int) -> torch.Tensor:
    """(B, ``limit``) keys for evaluation, row r's a function of row r's real tokens alone: a counter-based generator
    (as SplitMix's output is a mix of a Weyl sequence; keyed here by the sentence's hash,
    :func:`sentence_hashes`): key(r, c) = fmix32(fmix32((c + 1)·φ mod 2³²) xor h_r), φ = 0x9E3779B9.  For a row the
    map c → key is a bijection of 32-bit words (each step is one), so a row's keys are distinct: their order, and
    the subset that ``topk`` picks, is the same on every device.  The same sentence gets the same keys whatever its
    batch, padding, beam, seed or device; int64 operations on the tokens' device, no host sync (they replace a
    sha256 of each sentence on the host, which synced at every evaluation pass: issue 39)."""
    columns = fmix32((torch.arange(1, limit + 1, device=tokens.device) * WEYL32) & LOW32)
    return fmix32(columns.unsqueeze(0) ^ sentence_hashes(tokens, positions).unsqueeze(1))


def sample_positions(positions: torch.Tensor, limit: int, tokens: torch.Tensor = None) -> torch.Tensor:
    """Positions (B, T) of a pass (0 .. n_r−1 for row r's real tokens, −1 at padding) → the same rows with each
    row's positions replaced by a sorted uniform random subset of n_r positions of [0, ``limit``): from torch's
    generator, or, given the rows' ``tokens``, one fixed per sentence (drawn from its tokens: evaluation)."""
    real = positions.ge(0)
    lengths = real.sum(dim=1)
    # the longest row is taken to be the batch's width, as fairseq batches (every row padded to the longest), so
    # that nothing is read from the tensors (a host sync); a narrower longest row only draws more keys than it uses
    longest = positions.size(1)
    if positions.size(0) == 0 or longest == 0:
        return positions
    if longest > limit:
        raise UserError(f"--pe-random-positions {limit}: a sequence of {longest} tokens has no {longest} distinct "
                        f"positions in [0, {limit}); raise --pe-random-positions")
    # the `longest` largest of `limit` uniform keys: a uniform random subset, in random order, so its first n_r
    # members are a uniform subset of size n_r (as the authors' permutation of [0, L), this costs L per row: the
    # rows are drawn a block at a time, so that no more than KEY_ELEMENTS keys exist at once)
    rows = max(1, KEY_ELEMENTS // limit)
    chosen = []
    for start in range(0, positions.size(0), rows):
        end = min(start + rows, positions.size(0))
        keys = torch.rand(end - start, limit, device=positions.device) if tokens is None \
            else _keys_seeded_by_tokens(tokens[start:end], positions[start:end], limit)
        chosen.append(keys.topk(longest, dim=1).indices)
    chosen = chosen[0] if len(chosen) == 1 else torch.cat(chosen)
    columns = torch.arange(longest, device=positions.device)
    chosen = torch.where(columns < lengths.unsqueeze(1), chosen, limit).sort(dim=1).values
    return torch.where(real, chosen.gather(1, positions.clamp(min=0)), positions)


def spaced_positions(positions: torch.Tensor, source_lengths: torch.Tensor, limit: int) -> torch.Tensor:
    """Decoder positions (B, T) (0 .. t for the real tokens, −1 at padding) → the expected positions of training's
    draws for a target of m = ``source_lengths`` tokens: the k-th smallest of m distinct uniform draws from
    [0, L) is (L+1)·k/(m+1) − 1 on average (k = 1..m), so index t < m gets ⌊(t+1)(L+1)/(m+1)⌋ − 1 (at most
    L−1, strictly increasing as m ≤ L), and index t ≥ m the position of m−1 plus t−m+1 (1 apart: no position is
    clamped, and a hypothesis longer than its source goes past the trained range as it would with 0..n−1).
    Depends on the row's source and t only, so step-by-step decoding and the full pass agree."""
    m = source_lengths.view(-1, 1).to(positions.dtype)
    real = positions.ge(0)
    t = positions.clamp(min=0)
    within = torch.div((t.clamp(max=m - 1) + 1) * (limit + 1), m + 1, rounding_mode="floor") - 1
    spaced = within + (t - (m - 1)).clamp(min=0)
    return torch.where(real, spaced, positions)


def _largest_spaced_position(limit: int, target_length: int, source_length: int) -> int:
    """The largest of :func:`spaced_positions` over indices 0 .. T−1 for a source of m tokens: pos(min(T, m) − 1),
    at most L − 1, plus the T − m steps of 1 past the source's length."""
    t = min(target_length, source_length) - 1
    return (t + 1) * (limit + 1) // (source_length + 1) - 1 + max(0, target_length - source_length)


def spaced_source_length_of_largest(limit: int, target_length: int, source_width: int, padded: bool) -> int:
    """The source length m (1 .. ``source_width``) whose rows reach :func:`spaced_position_bound`: the width itself
    when nothing is padded.  For m ≥ T the largest position pos(T − 1) falls as m grows, so m ≤ T is enough."""
    if not padded:
        return source_width
    lengths = range(1, max(1, min(source_width, target_length)) + 1)
    return max(lengths, key=lambda m: (_largest_spaced_position(limit, target_length, m), m))


@functools.lru_cache(maxsize=1 << 12)
def spaced_position_bound(limit: int, target_length: int, source_width: int, padded: bool) -> int:
    """An exclusive bound of the positions :func:`spaced_positions` gives the indices 0 .. T−1 (T =
    ``target_length``) after sources padded to ``source_width`` tokens, decided from these sizes alone: no source
    length is read (that would be a host sync in every decoding step).  Exact when nothing is ``padded`` (every row's
    source has m = the width); for a padded batch the largest over the lengths 1 .. width that its rows can have
    (the bound is then reached by some batch of these sizes, though not necessarily by this one)."""
    if target_length <= 0:
        return 0
    m = spaced_source_length_of_largest(limit, target_length, max(1, source_width), padded)
    return _largest_spaced_position(limit, target_length, m) + 1
