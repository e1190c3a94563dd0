"""``fairseq-pe-gpu-check``: what the CPU test-suite cannot check, on a CUDA GPU, within a time budget.

* ``cli``: the command (its options, its output);
* ``registry``: the checks, one ``Check`` each, in the order they run; ``problems``: what a failing check raises;
* ``context``: what the checks share (the options, the device, the data, the models, each built once);
* the checks by kind: ``kernels``, ``masked_rows``, ``numerics`` (forward, incremental, positions), ``ddp``,
  ``training``, ``flex``;
* ``budget`` (the time budget) and ``runner`` (each check per system under it, isolated; the JSON and Markdown
  results).
"""
