"""What every fix module of :mod:`fairseq_pe.compat` shares: the version guard and the one-time patch.

A fix module names the fairseq releases it is written for (``FIXES_FAIRSEQ``, version prefixes) and has an
``apply()`` that calls :func:`fairseq_matches` first: on another release the fix is not applied and one warning
says so (fairseq's own behaviour then).  :func:`patch` wraps a fairseq attribute once; the wrapper keeps the
original as ``__wrapped__`` (``functools.wraps``), which is how the tests put stock fairseq back.
"""

import contextlib
import logging
import os

logger = logging.getLogger("fairseq_pe")

_warned = set()


def fairseq_version() -> str:
    import fairseq

    return getattr(fairseq, "__version__", "unknown")


#: fixes named here (separated by commas) are not applied: stock fairseq's behaviour, for comparison
SKIP_ENV = "FAIRSEQ_PE_SKIP_FIXES"


def skipped() -> set:
    return {name.strip() for name in os.environ.get(SKIP_ENV, "").split(",") if name.strip()}


def fairseq_matches(fixes: tuple, fix: str, consequence: str) -> bool:
    """True where the installed fairseq is one of the releases ``fixes`` (prefixes such as ``"0.12."``) and ``fix``
    is not named in ``FAIRSEQ_PE_SKIP_FIXES``; else one warning (once per process and fix) that ``fix`` is not
    applied and what that means."""
    if fix in skipped():
        if fix not in _warned:
            _warned.add(fix)
            logger.warning(f"{SKIP_ENV}: fairseq-pe's fix '{fix}' is not applied: {consequence}")
        return False
    version = fairseq_version()
    if version.startswith(tuple(fixes)):
        return True
    if fix not in _warned:
        _warned.add(fix)
        logger.warning(f"fairseq {version}: fairseq-pe's fix '{fix}' is written for fairseq "
                       f"{', '.join(p + 'x' for p in fixes)} and is not applied: {consequence}")
    return False


#: fix (its module's name) -> the (owner, attribute) it wrapped, and the (register, hook, handle) it registered
patched = {}
hooks = {}


def _fix_of(function) -> str:
    return function.__module__.rpartition(".")[2]


def patch(owner, name: str, wrap):
    """Replace ``owner.name`` by ``wrap(owner.name)``, once (the wrappers mark themselves ``_fairseq_pe_patched``)."""
    original = getattr(owner, name)
    if not getattr(original, "_fairseq_pe_patched", False):
        setattr(owner, name, wrap(original))
        patched.setdefault(_fix_of(wrap), []).append((owner, name))


def add_hook(register, hook):
    """``register(hook)`` (an extension point that returns a removable handle, as torch's hooks do), once."""
    entries = hooks.setdefault(_fix_of(hook), [])
    if not any(h is hook for _, h, _ in entries):
        entries.append((register, hook, register(hook)))


@contextlib.contextmanager
def without(fix: str):
    """Within the block, fairseq as it is without ``fix`` (the tests' way to show what the fix changes): what it
    wrapped is fairseq's own again, its hooks are removed; all are back afterwards."""
    wrapped = [(owner, name, getattr(owner, name)) for owner, name in patched.get(fix, [])]
    for owner, name, wrapper in wrapped:
        setattr(owner, name, wrapper.__wrapped__)
    for _, _, handle in hooks.get(fix, []):
        handle.remove()
    try:
        yield
    finally:
        for owner, name, wrapper in wrapped:
            setattr(owner, name, wrapper)
        hooks[fix] = [(register, hook, register(hook)) for register, hook, _ in hooks.get(fix, [])]
