"""fairseq-pe: position encodings for fairseq (``fairseq-train --user-dir fairseq_pe``).

Importing the package registers the ``transformer_pe`` model and its architectures and
applies the fixes of :mod:`fairseq_pe.compat`.
"""

__version__ = "0.1.0"

from . import compat

compat.apply()

from . import models  # noqa: E402,F401  (registers models and architectures)
