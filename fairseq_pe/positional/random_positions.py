"""Randomised positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length Generalization of
Transformers", §3): ``--pe-random-positions L`` gives the n tokens of a sequence an ordered random subset of
n positions drawn uniformly from [0, L), instead of 0 .. n−1, so that a model trained on short sequences has
seen every position (and distance) up to L and a longer test input stays in distribution.  Every encoding that
takes integer positions uses them: the absolute tables and sinusoids, RoPE and xPos, and the relative biases
and vectors, whose distances become those of the sampled positions.

Each row draws its own subset (the official code draws one per batch; here rows of different lengths get a
uniform subset of their own size, and padding takes no position).  Training samples at every forward pass.
Evaluation follows the paper (whose code samples at test time too) where fairseq allows it: the encoder side
gets a random subset as in training, drawn from a generator seeded by the sentence's tokens, so that a sentence
has the same positions whatever its batch, seed or beam, and ``fairseq-generate``'s scores are reproducible; the
decoder uses 0 .. n−1 by default, because step-by-step generation cannot draw an ordered subset whose size is not
yet known, and its full passes (``--score-reference``, validation) must give the scores of generation.
``--pe-random-eval-decoder spaced`` gives it instead the positions that training draws on average for a target
as long as the source (:func:`spaced_positions`): 0 .. n−1 is a configuration that training draws with
probability 1/C(L, n), while training's neighbours are (L+1)/(n+1) apart on average.  L bounds
the lengths: a longer sequence has no n distinct positions in [0, L), so the model's ``max_positions`` is at
most L and fairseq refuses longer inputs by name.
"""

import hashlib

import torch

from fairseq_pe.errors import UserError


#: the most random keys drawn at once (rows × L)
KEY_ELEMENTS = 1 << 22


def _keys_seeded_by_tokens(tokens: torch.Tensor, real: torch.Tensor, limit: int) -> torch.Tensor:
    """(B, limit) uniform keys, row r's from a generator seeded by row r's real tokens (evaluation)."""
    rows = []
    for row, mask in zip(tokens.cpu(), real.cpu()):
        digest = hashlib.sha256(row[mask].numpy().astype("int64").tobytes()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        rows.append(torch.rand(limit, generator=generator))
    return torch.stack(rows).to(tokens.device)


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
            else _keys_seeded_by_tokens(tokens[start:end], real[start:end], limit)
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
