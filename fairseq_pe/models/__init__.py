from . import transformer_pe  # noqa: F401  (registers the model and its architectures)
