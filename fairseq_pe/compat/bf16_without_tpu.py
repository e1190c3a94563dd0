"""Fix 6: ``fairseq-train --bf16`` trains on the GPU or the CPU it is given.

fairseq 0.12's parser sets ``--tpu`` with ``--bf16`` (bf16 was a TPU feature then), so bf16 training asks for
torch_xla and stops.  Without ``--tpu`` on the command line (and without torch_xla) ``--tpu`` is cleared again.

Extension point: none; the flag is set inside ``options.parse_args_and_arch`` after every plugin's ``add_args``
(a wrapper, once).
"""

import functools

from fairseq_pe.compat.patching import fairseq_matches, patch

#: the fairseq releases this fix is written for
FIXES_FAIRSEQ = ("0.12.",)
#: it changes stock fairseq's behaviour for every task of the process (docs/install.md lists it)
CHANGES_STOCK = True
SUMMARY = "--bf16 without --tpu trains on the given device (fairseq 0.12 set --tpu)"


def _bf16_without_tpu(parse_args_and_arch):
    """fairseq 0.12's parser turns ``--bf16`` into ``--tpu`` (bf16 was a TPU feature when it was written): on a GPU
    or the CPU, ``fairseq-train --bf16`` then asks for torch_xla and stops.  Unless ``--tpu`` is on the command line
    or torch_xla is installed, ``--bf16`` trains on the device it is given, as ``--fp16`` does (bf16 weights,
    fairseq's FP16Optimizer with float32 masters and no loss scaling, or ``--memory-efficient-bf16``)."""
    @functools.wraps(parse_args_and_arch)
    def wrapper(parser, input_args=None, *args, **kwargs):
        import importlib.util
        import sys

        parsed = parse_args_and_arch(parser, input_args, *args, **kwargs)
        namespace = parsed[0] if isinstance(parsed, tuple) else parsed
        given = sys.argv[1:] if input_args is None else input_args
        if getattr(namespace, "bf16", False) and getattr(namespace, "tpu", False) and "--tpu" not in given \
                and importlib.util.find_spec("torch_xla") is None:
            namespace.tpu = False
        return parsed

    wrapper._fairseq_pe_patched = True
    return wrapper


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "bf16_without_tpu",
                           "--bf16 asks for torch_xla (--tpu)"):
        return False
    from fairseq import options

    patch(options, "parse_args_and_arch", _bf16_without_tpu)
    return True
