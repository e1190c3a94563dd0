"""Measurements of the plugin against stock fairseq, and the checks of a GPU machine; each a console script.

* ``fairseq-pe-benchmark`` (``cli``): speed and memory of every position encoding as ratios to stock fairseq, one
  module per measurement: ``translation`` (the default: ``train_generate``, ``encoder_memory``), ``long_context``
  (``--long``, ``--long-train``), ``language_model`` (``--lm``); what they share: ``models`` (stock and plugin of the
  same size), ``targets``, ``options`` (the options every measurement takes), ``runner`` (child processes, progress,
  a call's time and memory, the results files);
* ``fairseq-pe-count-ops`` (``count_ops``): host syncs and operators per training, encoder and decoding step;
* ``fairseq-pe-sdpa-arguments`` (``sdpa_arguments``): what every attention hands to SDPA, docs/speed.md's tables;
* ``fairseq-pe-gpu-check`` (``gpu_check``): the GPU acceptance check.

None of them imports torch or fairseq for ``--help`` or a bad argument (``tests/test_cli_startup.py``).
"""
