"""The position-encoding interface and the one registry every model builds from.

Positions are 0-based indices of the non-padding tokens of a sequence (left padding is
skipped, so the first real token is position 0 whatever the padding); padding tokens get
position -1 and a zero vector.

Two kinds of encoding plug in:

* ``absolute`` encodings (:class:`AbsolutePositionEncoding`) map positions to vectors that
  are added to the hidden states at the input block, and with ``--pe-all-blocks`` at the
  input of every block (``block`` is 1-based, block 1 being the embedding layer);
* ``relative`` encodings act inside self-attention and register under the same registry
  with kind ``"relative"``.
"""

from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn

_REGISTRY: Dict[Tuple[str, str], Callable] = {}
KINDS = ("absolute", "relative")


def register_position_encoding(kind: str, name: str):
    """Class decorator: make ``name`` a choice of ``--pe-<kind>``."""
    if kind not in KINDS:
        raise ValueError(f"unknown position-encoding kind {kind!r}; expected one of {KINDS}")

    def wrap(cls):
        key = (kind, name)
        if key in _REGISTRY:
            raise ValueError(f"{kind} position encoding {name!r} is registered twice")
        _REGISTRY[key] = cls
        cls.registry_name = name
        return cls

    return wrap


def position_encoding_choices(kind: str):
    return ["none"] + sorted(name for k, name in _REGISTRY if k == kind)


def build_position_encoding(kind: str, name: str, **kwargs) -> Optional[nn.Module]:
    """Instantiate the encoding registered as ``(kind, name)``; ``"none"`` gives ``None``."""
    if name in (None, "none"):
        return None
    try:
        cls = _REGISTRY[(kind, name)]
    except KeyError:
        raise ValueError(
            f"unknown --pe-{kind} {name!r}; choose one of {position_encoding_choices(kind)}"
        ) from None
    return cls(**kwargs)


class PositionOutOfRangeError(ValueError):
    """A position beyond what an encoding can represent was requested."""


class AbsolutePositionEncoding(nn.Module):
    """Interface of absolute encodings: ``forward(length, block)`` is the (length × D) table
    of the vectors of positions 0 .. length-1 that block ``block`` receives.

    Args:
        embed_dim: size D of the vectors.
        num_blocks: how many blocks the model has (the number of layers).
        all_blocks: whether every block receives vectors (``--pe-all-blocks``) or only the
            input block (block 1).
        max_positions: the number of positions a table-based encoding holds; ignored by
            encodings that work at any length (``has_length_limit = False``).
        max_positions_flag: the command-line flag that sets ``max_positions``, named in the
            error raised for a longer sequence.
    """

    #: whether the encoding has a length limit (a table); sinusoids have none
    has_length_limit = False

    def __init__(self, embed_dim: int, num_blocks: int = 1, all_blocks: bool = False,
                 max_positions: Optional[int] = None, max_positions_flag: str = "--max-source-positions"):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_blocks = num_blocks
        self.all_blocks = all_blocks
        self.max_positions = max_positions if self.has_length_limit else None
        self.max_positions_flag = max_positions_flag

    def check_range(self, max_position: int):
        """Raise a clear error if position ``max_position`` cannot be encoded."""
        if self.max_positions is not None and max_position >= self.max_positions:
            raise PositionOutOfRangeError(
                f"--pe-absolute {self.registry_name}: a sequence of {max_position + 1} tokens needs "
                f"position {max_position}, but the table was built with {self.max_positions} positions "
                f"({self.max_positions_flag} {self.max_positions} at training time). Train with a larger "
                f"{self.max_positions_flag}, or use an encoding without a length limit "
                f"(e.g. --pe-absolute sinusoidal)."
            )

    def forward(self, length: int, block: int = 1) -> torch.Tensor:
        """The (length × embed_dim) vectors of positions 0 .. length-1 for 1-based ``block``."""
        raise NotImplementedError
