"""Language-model tools: perplexity at lengths past the training length (``extrapolation.py``,
``fairseq-pe-lm-lengths``)."""
