from . import transformer_pe  # noqa: F401  (registers the model and its architectures)
from . import roberta_pe  # noqa: F401  (registers roberta_pe and its architectures)
from . import transformer_lm_pe  # noqa: F401  (registers transformer_lm_pe and its architectures)
