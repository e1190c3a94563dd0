"""fairseq-pe: position encodings for fairseq (``fairseq-train --user-dir fairseq_pe``).

The plugin registers the ``transformer_pe`` and ``roberta_pe`` models and their architectures, the
``span_prediction`` task and criterion, and applies the fixes of :mod:`fairseq_pe.compat` (one module per fix),
as soon as fairseq is imported: at once when it already is (``--user-dir fairseq_pe``: fairseq imports the plugin),
else right after ``import fairseq`` happens (wrapt's post-import hook).  Tools that do not need fairseq
(``fairseq-pe-bucket-bleu``, ``-s2l-split``, the data preparation, GLUE/SQuAD scoring) thus start without
importing it; :func:`register` does it by hand.
"""

__version__ = "0.2.0"

import sys

import wrapt

from .errors import install_excepthook

install_excepthook()  # in fairseq's own tools only (fairseq-train --user-dir fairseq_pe ...): errors.py


def register(_fairseq=None) -> None:
    """Apply :mod:`fairseq_pe.compat` and register the plugin's models, task and criterion with fairseq
    (importing it); idempotent."""
    from . import compat

    compat.apply()
    from . import models  # noqa: F401  (registers models and architectures)
    from . import criterions, tasks  # noqa: F401  (registers the span_prediction task and criterion)


if "fairseq" in sys.modules:
    register()
else:
    wrapt.register_post_import_hook(register, "fairseq")
