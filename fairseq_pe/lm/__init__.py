"""Language-model tools: perplexity and the loss by token position at lengths past the training length
(``extrapolation.py``, ``fairseq-pe-lm-lengths``, with ``positions.py`` and ``lengths_plot.py``), validation loss
against tokens seen (``curves.py``, ``fairseq-pe-lm-curves``) and CoPE's counting task (``counting.py``,
``fairseq-pe-counting``)."""
