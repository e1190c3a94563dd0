"""fairseq-pe: position encodings for fairseq (``fairseq-train --user-dir fairseq_pe``).

Importing the package registers the ``transformer_pe`` and ``roberta_pe`` models and their architectures and
applies the fixes of :mod:`fairseq_pe.compat`.
"""

__version__ = "0.1.0"

from . import compat

compat.apply()

from . import models  # noqa: E402,F401  (registers models and architectures)
from . import criterions, tasks  # noqa: E402,F401  (registers the span_prediction task and criterion)
