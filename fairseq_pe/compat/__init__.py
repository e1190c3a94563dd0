"""fairseq 0.12's traps on today's torch, fixed when the plugin is imported: one module per fix.

Each module names the fairseq releases it is written for (``FIXES_FAIRSEQ``: another release gets one warning and
fairseq's own behaviour), says in ``CHANGES_STOCK`` whether it changes stock fairseq for every task of the process,
and has an ``apply()``; :func:`apply` applies them all, once, and logs their names in one line (in the log of
fairseq's own tools, ``fairseq-train``'s included).  What each fixes,
and why: docs/install.md, "Fixes applied when the plugin is imported".  Two more of that list are no patch: the
attention fast path (every attention of the plugin's models is a
:class:`~fairseq_pe.models.attention.PositionAttention`) and user errors (:mod:`fairseq_pe.errors`).
"""

import logging

from fairseq_pe.compat import (
    archive_extraction,
    batch_by_size,
    bf16_without_tpu,
    checkpoint_loading,
    constrained_parameters,
    distributed_cpu,
    exact_resume,
    hydra_errors,
    legacy_ddp_dtypes,
    literal_options,
    numpy2_eos_blocks,
    run_checks,
    size_errors,
)

#: every fix, in the order it is applied
FIXES = (checkpoint_loading, literal_options, archive_extraction, batch_by_size, size_errors, distributed_cpu, bf16_without_tpu, constrained_parameters,
         legacy_ddp_dtypes, exact_resume, numpy2_eos_blocks, hydra_errors, run_checks)

#: the names of the fixes applied in this process (set by :func:`apply`)
applied = []


def fix_name(module) -> str:
    return module.__name__.rpartition(".")[2]


def apply() -> list:
    """Apply every fix that fits the installed fairseq, once per process; log which, in one line.  Returns the
    names of those applied."""
    if applied:
        return applied
    for module in FIXES:
        if module.apply():
            applied.append(fix_name(module))
    from fairseq_pe.compat.patching import fairseq_version

    stock = [fix_name(m) for m in FIXES if m.CHANGES_STOCK and fix_name(m) in applied]
    own = [name for name in applied if name not in stock]
    parts = ([f"{', '.join(stock)} (they change stock fairseq for every task of this process)"] if stock else []) + \
        ([f"{', '.join(own)} (the plugin's parameters only)"] if own else [])
    from fairseq_pe.errors import fairseq_cli_process

    if not fairseq_cli_process():  # the plugin's tools and library callers: not in their output
        return applied
    logging.getLogger("fairseq_pe").info(
        f"fairseq-pe: applied fixes of fairseq {fairseq_version()}: {'; '.join(parts) or 'none'}; "
        "see docs/install.md, 'Fixes applied when the plugin is imported'")
    return applied
