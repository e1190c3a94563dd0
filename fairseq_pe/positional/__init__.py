"""Position encodings: one interface, one registry (see :mod:`.base`)."""

from .base import (  # noqa: F401
    AbsolutePositionEncoding,
    RelativePositionEncoding,
    PositionOutOfRangeError,
    build_position_encoding,
    position_encoding_choices,
    register_position_encoding,
)
from .injector import PositionInjector, token_positions  # noqa: F401

# importing the families registers them
from . import alibi, fire, kerple, learned, relative_vectors, rotary, sandwich, sinusoidal, t5_bias  # noqa: F401,E402
from . import fourier_rotary, partial_rotary  # noqa: F401,E402
from . import cope, forgetting  # noqa: F401,E402
