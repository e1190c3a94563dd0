"""User errors: one clear line and exit status 2, as argparse reports a bad option.

A mistake in what the user gave (an option's value, a file, a sequence longer than a learned
table) raises :class:`UserError` (a ``ValueError``), whose message names the flag or file
to fix.  Wherever it is raised, in ``fairseq-train``/``fairseq-generate`` through
``--user-dir fairseq_pe`` or in a ``fairseq-pe-*`` tool, the process ends with

    PROG: error: MESSAGE

on stderr and exit status 2, without a traceback.  Every other exception is a bug and keeps
its full traceback.  ``FAIRSEQ_PE_TRACEBACK=1`` shows the traceback of user errors too.

Where: the plugin's console scripts catch it (:func:`cli`); fairseq's own (``fairseq-train``, ``fairseq-generate``,
... with ``--user-dir fairseq_pe``, or ``python -m fairseq_cli.X``) get :func:`install_excepthook` when they import
the plugin.  Nowhere else: ``import fairseq_pe`` in a script, a notebook or the REPL leaves ``sys.excepthook`` as
it is, so a user error there is an ordinary exception.  The hook raises ``SystemExit(2)`` (the interpreter then
exits as for ``sys.exit(2)``, atexit handlers included), never ``os._exit``.
"""

import contextlib
import os
import sys

TRACEBACK_ENV = "FAIRSEQ_PE_TRACEBACK"


class UserError(ValueError):
    """A mistake in the user's input: the message names the flag or file to fix."""


class CheckpointRefused(UserError):
    """A checkpoint that could run code as it loads: its pickle needs more than
    :func:`fairseq_pe.safe_load.checkpoint_globals`, or an option that fairseq evaluates is not a literal
    (:mod:`fairseq_pe.compat.literal_options`)."""


def user_error_message(exc: BaseException, prog: str = None) -> str:
    prog = prog or os.path.basename(sys.argv[0] or "fairseq-pe") or "fairseq-pe"
    return f"{prog}: error: {exc}"


def _user_error(exc):
    """``exc`` if it is a :class:`UserError`, or the one fairseq re-raised as a plain ``Exception`` (its Trainer's
    "Cannot load model parameters from checkpoint ...; please ensure that the architectures match." around any
    error while a checkpoint loads, e.g. one refused by name); else None."""
    while type(exc) is Exception and exc.__context__ is not None:
        exc = exc.__context__
    return exc if isinstance(exc, UserError) else None


def _write_user_error(exc):
    """``PROG: error: MESSAGE`` on stderr, after what stdout holds."""
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001  (a closed stdout must not hide the message)
        pass
    sys.stderr.write(user_error_message(exc) + "\n")
    sys.stderr.flush()


def _handle(exc_type, exc, tb, previous):
    user_error = _user_error(exc)
    if user_error is not None and not os.environ.get(TRACEBACK_ENV):
        _write_user_error(user_error)
        # argparse's status for a usage error: SystemExit raised by the hook ends the interpreter with it, as
        # sys.exit(2) does (CPython's PyErr_Print handles a SystemExit from sys.excepthook), atexit handlers run
        raise SystemExit(2)
    previous(exc_type, exc, tb)


def _interactive() -> bool:
    return bool(sys.flags.interactive) or hasattr(sys, "ps1") or "IPython" in sys.modules


def fairseq_cli_process() -> bool:
    """Whether this process is one of fairseq's command-line tools (``fairseq-train``, ``fairseq-generate``, ...,
    or ``python -m fairseq_cli.X``), not an interactive session."""
    if _interactive():
        return False
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and (spec.name or "").startswith("fairseq_cli."):
        return True
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return script.startswith("fairseq-") and not script.startswith("fairseq-pe") and "fairseq_cli" in sys.modules


def hydra_cli_process() -> bool:
    """Whether this process is ``fairseq-hydra-train`` (or ``python -m fairseq_cli.hydra_train``): Hydra prints any
    exception of the run with its traceback and exits 1, so the excepthook never sees a user error there."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name == "fairseq_cli.hydra_train":
        return True
    return bool(sys.argv) and os.path.basename(sys.argv[0] or "") == "fairseq-hydra-train"


@contextlib.contextmanager
def hydra_user_errors():
    """In ``fairseq-hydra-train`` (:func:`hydra_cli_process`), a :class:`UserError` raised inside the block ends the
    process as the excepthook ends fairseq's other tools: ``PROG: error: MESSAGE`` and exit status 2 (a
    ``SystemExit``, which Hydra's handler of exceptions lets through).  Elsewhere the error propagates."""
    try:
        yield
    except UserError as exc:
        if not hydra_cli_process() or os.environ.get(TRACEBACK_ENV):
            raise
        _write_user_error(exc)
        raise SystemExit(2) from exc


def install_excepthook():
    """In one of fairseq's command-line tools only (:func:`fairseq_cli_process`): report an uncaught
    :class:`UserError` as one line with exit status 2 (module docstring).  Elsewhere it does nothing."""
    if not fairseq_cli_process():
        return
    current = sys.excepthook
    if getattr(current, "_fairseq_pe_patched", False):
        return
    previous = current

    def hook(exc_type, exc, tb):
        if _interactive():  # became interactive later (PYTHONINSPECT): the REPL must go on
            return previous(exc_type, exc, tb)
        _handle(exc_type, exc, tb, previous)

    hook._fairseq_pe_patched = True
    sys.excepthook = hook


@contextlib.contextmanager
def as_user_errors():
    """Inside the block a ``ValueError`` is a user error (building a model from its options, say)."""
    try:
        yield
    except UserError:
        raise
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def console_script_name(function):
    """The console script (setup.py's entry points) whose module defines ``function``, if any:
    ``python -m fairseq_pe.translation.quickstart`` then reports errors as ``fairseq-pe-quickstart``."""
    from importlib.metadata import entry_points

    try:
        scripts = entry_points(group="console_scripts")
    except Exception:  # noqa: BLE001  (metadata of a broken install must not hide the error)
        return None
    module = function.__module__
    if module == "__main__":  # python -m fairseq_pe.X
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec is not None else module
    for script in scripts:
        if script.value.split(":")[0] == module:
            return script.name
    return None


def cli(main):
    """Decorator for console-script ``main`` functions: a :class:`UserError` ends the process as
    ``PROG: error: MESSAGE`` with status 2 (also when called in-process, as ``SystemExit(2)``)."""
    import functools

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as exc:
            if os.environ.get(TRACEBACK_ENV):
                raise
            sys.stderr.write(user_error_message(exc, console_script_name(main)) + "\n")
            raise SystemExit(2) from exc

    return wrapper
