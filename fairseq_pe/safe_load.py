"""Checkpoints load without running code: ``torch.load(weights_only=True)`` and an allowlist (issue 40, 4).

A fairseq checkpoint is a pickle, and a pickle can name any function of any module to call while it loads
(``os.system`` with a command, say).  torch's ``weights_only`` unpickler calls nothing but what an allowlist names.
Every checkpoint the plugin loads goes through :func:`checkpoint_loading` (fairseq's loader of ``--path``,
``--restore-file``, ``--finetune-from-model``, the hub's ``from_pretrained``, averaging and analysis; the seed of
``--ema-seed-model``; the copy a resumed distributed training broadcasts from rank 0 to the other ranks) or
:func:`load` (the warm starts): ``weights_only=True`` with :func:`checkpoint_globals` allowed, and nothing else.

The allowlist is what checkpoints of fairseq 0.12 and of this plugin hold, found by loading real ones
(``torch.serialization.get_unsafe_globals_in_checkpoint``; tests/test_safe_load.py loads each kind):

* ``argparse.Namespace``: the model's options (``cfg.model``, ``args``) of every fairseq 0.12 checkpoint, stock
  ``transformer`` and the plugin's models, fairseq-pe 0.1's (tests/fixtures) included;
* omegaconf's ``DictConfig``, ``ListConfig``, ``AnyNode``, ``ContainerMetadata``, ``Metadata``, and what their
  metadata names (``typing.Any``, ``dict``, ``list``, ``int``, ``collections.defaultdict``): the configuration
  that fairseq's loader turns into a ``DictConfig`` before a resumed distributed training broadcasts it;
* fairseq's ``distributed.utils._TensorPlaceholder``: the broadcast's stand-in for each tensor, sent apart.
* numpy's scalar and its dtype (:func:`numpy_scalar_globals`): a fine-tuned ``sentence_prediction`` checkpoint's best
  metric (tests/test_glue.py loads one through ``fairseq-pe-glue-eval``).

A file that needs anything else is refused (:class:`CheckpointRefused`, one line, exit status 2) naming what it
needs, before any of it runs.  ``FAIRSEQ_PE_TRUST_CHECKPOINTS=1`` (read at each load) trusts every checkpoint of the
process: it loads with ``weights_only=False``, as fairseq-pe < 0.3 loaded every one.  torch's own
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` does not turn the check off here (it is set process-wide to run stock fairseq
on torch >= 2.6): only the plugin's own variable does.

The allowlist is scoped: it is added for the duration of each load (``torch.serialization.safe_globals``, only the
entries not already allowed, so a caller's own ``add_safe_globals`` stays), under a lock that one load of the
plugin's holds at a time.  fairseq calls ``torch.load`` without ``weights_only``: a wrapper of ``torch.load`` passes
``weights_only`` to torch for the calls of the thread that is inside a load of the plugin's (a thread-local policy),
which no environment variable overrides; the process environment is never touched.  Any other ``torch.load`` of the
process, in any thread, keeps torch's default.
"""

import collections
import contextlib
import functools
import os
import pickle
import re
import threading
import typing

from fairseq_pe.errors import CheckpointRefused

#: set to 1 (or yes/true) to trust every checkpoint of the process: it loads with ``weights_only=False``
TRUST_ENV = "FAIRSEQ_PE_TRUST_CHECKPOINTS"
_TRUE = ("1", "y", "yes", "true")


def trusted() -> bool:
    """Whether ``FAIRSEQ_PE_TRUST_CHECKPOINTS`` trusts every checkpoint (read now, not at import)."""
    return os.environ.get(TRUST_ENV, "").strip().lower() in _TRUE


def checkpoint_globals() -> list:
    """What the pickles of fairseq 0.12's and the plugin's checkpoints name, beside torch's own allowlist
    (tensors, storages, ``OrderedDict``): the module docstring says where each is found."""
    import argparse

    from fairseq.distributed.utils import _TensorPlaceholder
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode

    return [argparse.Namespace,
            DictConfig, ListConfig, AnyNode, ContainerMetadata, Metadata, typing.Any, dict, list, int,
            collections.defaultdict,
            _TensorPlaceholder, *numpy_scalar_globals()]


def numpy_scalar_globals() -> list:
    """A numpy scalar as pickled (its dtype and bytes): a fine-tuned ``sentence_prediction`` checkpoint keeps its
    best validation metric as one (``extra_state``'s best, e.g. STS-B's correlation from scipy).  Pickled under
    numpy 2 it is ``numpy._core.multiarray.scalar``; under numpy 1.x, as fairseq 0.12's own checkpoints were,
    ``numpy.core.multiarray.scalar``: the same function, allowed under both names."""
    import numpy as np

    scalar = np._core.multiarray.scalar
    return [scalar, (scalar, "numpy.core.multiarray.scalar"), np.dtype, type(np.dtype(np.float64)),
            type(np.dtype(np.float32)), type(np.dtype(np.int64))]


#: the load policy of the thread inside :func:`checkpoint_loading` (``weights_only`` True or False), per thread
_policy = threading.local()
#: held for the whole of each load of the plugin's: the allowlist is added to torch's process-wide set and removed
#: again, so two loads of two threads never see each other's additions half made or half removed
_LOCK = threading.RLock()


def _policy_load(load):
    """``torch.load`` that passes the current thread's policy (:func:`checkpoint_loading`) as ``weights_only`` where
    its caller (fairseq) passes none; every other call, in this thread or another, is torch's own."""
    @functools.wraps(load)
    def wrapper(*args, **kwargs):
        weights_only = getattr(_policy, "weights_only", None)
        if weights_only is not None and kwargs.get("weights_only") is None:
            kwargs["weights_only"] = weights_only
        return load(*args, **kwargs)

    wrapper._fairseq_pe_policy = True
    return wrapper


def _install():
    import torch

    if not getattr(torch.load, "_fairseq_pe_policy", False):
        torch.load = _policy_load(torch.load)


@contextlib.contextmanager
def _thread_policy(weights_only: bool):
    _install()
    outer = getattr(_policy, "weights_only", None)
    _policy.weights_only = weights_only
    try:
        yield
    finally:
        _policy.weights_only = outer


@contextlib.contextmanager
def trusted_torch_load():
    """Within the block, this thread's ``torch.load`` calls that do not pass ``weights_only`` use ``False`` (a
    trusted file)."""
    with _thread_policy(False):
        yield


@contextlib.contextmanager
def weights_only_torch_load():
    """Within the block, this thread's ``torch.load`` calls load with ``weights_only=True`` (passed to torch, which
    no environment variable overrides) and :func:`checkpoint_globals` allowed (those not allowed already: leaving
    the block removes only these), under a lock that one load of the plugin's holds at a time."""
    import torch

    with _LOCK:
        allowed = set(torch.serialization.get_safe_globals())
        added = [g for g in checkpoint_globals() if g not in allowed]
        with _thread_policy(True), torch.serialization.safe_globals(added):
            yield


#: torch's weights-only refusals of a pickle's content (not of a damaged file: "Unsupported operand", EOF ...)
_REFUSALS = ("Unsupported global", "unsupported GLOBAL", "Trying to call reduce", "Can only build",
             "Can only create new object")


def refused_global(error: BaseException):
    """What a weights-only ``torch.load`` refused (``posix.system``, or torch's words), or None when ``error`` is
    not such a refusal."""
    if not isinstance(error, pickle.UnpicklingError):
        return None
    message = str(error)
    if not any(refusal in message for refusal in _REFUSALS):
        return None
    found = re.search(r"GLOBAL ([\w.]+)", message)
    if found:
        return found.group(1)
    found = re.search(r"WeightsUnpickler error: ([^\n]*)", message)
    return f"what torch's weights-only unpickler refuses ({found.group(1).strip() if found else 'see torch.load'})"


def unpickling_failure(error: BaseException):
    """One line saying why torch's weights-only unpickler stopped on a damaged or foreign file (torch's message is
    several lines; garbage can also raise a ``KeyError`` inside the unpickler), or None when ``error`` did not come
    from it."""
    if isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in str(error):
        lines = [line.strip() for line in str(error).split("WeightsUnpickler error:")[-1].splitlines()]
        lines = [line for line in lines if line and not line.startswith("Check the documentation")]
        return lines[0] if lines else "Weights only load failed"
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith("_weights_only_unpickler.py"):
            return f"{type(error).__name__}: {error}"
        tb = tb.tb_next
    return None


#: the opcodes that name a global (``GLOBAL`` and ``INST`` carry "module name"; ``STACK_GLOBAL`` takes two strings)
_NAMING = ("GLOBAL", "INST")
_STRINGS = ("UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING")


def _pickle_streams(path):
    """The pickle byte streams of a checkpoint file, read, never run: the ``data.pkl`` of torch's zip format, or the
    file itself (torch's legacy format: pickles one after another, then the storages' raw bytes)."""
    import io
    import zipfile

    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            return [io.BytesIO(archive.read(name)) for name in archive.namelist() if name.endswith("data.pkl")]
    with open(path, "rb") as f:
        return [io.BytesIO(f.read())]


def pickle_contents(path):
    """``(protocol, opcodes, globals)`` of the pickles of the checkpoint ``path``, read by :mod:`pickletools` (which
    decodes opcodes and runs nothing): the highest protocol, the names of the opcodes used, and the
    ``module.name`` of every global named (``GLOBAL``/``INST``, and ``STACK_GLOBAL`` from the two strings before it,
    memoised ones included).  A stream that is no complete pickle raises ``ValueError``."""
    import pickletools

    protocol, opcodes, found = 0, set(), set()
    for stream in _pickle_streams(path):
        pickles = 0
        while stream.tell() < len(stream.getbuffer()):
            strings, memo = [], {}
            try:
                for op, arg, _ in pickletools.genops(stream):
                    opcodes.add(op.name)
                    protocol = max(protocol, op.proto)
                    if op.name == "PROTO":
                        protocol = max(protocol, arg)
                    if op.name in _STRINGS:
                        strings.append(arg.decode("latin-1") if isinstance(arg, bytes) else arg)
                    elif op.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                        memo[arg if op.name != "MEMOIZE" else len(memo)] = strings[-1] if strings else None
                    elif op.name in ("GET", "BINGET", "LONG_BINGET") and isinstance(memo.get(arg), str):
                        strings.append(memo[arg])
                    elif op.name in _NAMING:
                        found.add(arg.replace(" ", "."))
                    elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                        found.add(f"{strings[-2]}.{strings[-1]}")
            except ValueError:  # the storages' raw bytes after a legacy file's pickles; before any: no pickle
                if not pickles:
                    raise
                break
            pickles += 1
    return protocol, opcodes, found


def foreign_globals(found) -> list:
    """The globals of ``found`` that neither torch's weights-only unpickler nor :func:`checkpoint_globals` allows."""
    import torch

    allowed = set()
    try:
        from torch._weights_only_unpickler import _get_allowed_globals

        allowed.update(_get_allowed_globals())
    except ImportError:  # another torch: its own names are the torch.* ones
        allowed.update(name for name in found if name.startswith("torch."))
    for entry in [*checkpoint_globals(), *torch.serialization.get_safe_globals()]:
        obj, name = entry if isinstance(entry, tuple) else (entry, None)
        allowed.add(name or f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}")
    return sorted(name for name in found if name not in allowed)


def unsupported_pickle(what: str, path, failure: str):
    """Where torch's weights-only unpickler stopped at an opcode it does not read (``Unsupported operand``: the
    pickle protocols 0, 1, 4 and 5 use some), the :class:`CheckpointRefused` that says what the file needs, read
    by :func:`pickle_contents`: the globals it would call, or the protocol to re-save it with; None elsewhere."""
    found = re.search(r"Unsupported operand (\d+)", failure)
    if not found or path is None or not os.path.isfile(str(path)):
        return None
    import pickletools

    code = chr(int(found.group(1)))
    opname = next((op.name for op in pickletools.opcodes if op.code == code), f"opcode {found.group(1)}")
    try:
        protocol, _, named = pickle_contents(str(path))
    except Exception:  # noqa: BLE001  (a file pickletools cannot read either: torch's failure stands)
        return None
    needs = foreign_globals(named)
    if needs:
        return CheckpointRefused(refusal_message(what, ", ".join(needs)) + f" (it is pickled with protocol {protocol})")
    return CheckpointRefused(
        f"{what}: refused: it is pickled with protocol {protocol}, whose {opname} torch's weights-only unpickler does "
        "not read; re-save it with torch.save's default protocol (2), or if you trust this file, load it with "
        f"{TRUST_ENV}=1")


def refusal_message(what: str, needs: str) -> str:
    return (f"{what}: refused: its pickle needs {needs}, which no fairseq or fairseq-pe checkpoint holds, and "
            f"loading it could run code; if you trust this file, load it with {TRUST_ENV}=1")


@contextlib.contextmanager
def checkpoint_loading(what: str, path=None):
    """``torch.load`` inside the block loads a checkpoint safely (``weights_only=True`` with the allowlist), or as a
    trusted file with ``FAIRSEQ_PE_TRUST_CHECKPOINTS=1``; a refusal is a :class:`CheckpointRefused` that names
    ``what`` (``checkpoint PATH``, ``--ema-seed-model PATH``), what the file needs, and the variable.  Given the
    file's ``path``, a pickle that the unpickler cannot read is refused saying what it needs
    (:func:`unsupported_pickle`)."""
    if trusted():
        with trusted_torch_load():
            yield
        return
    try:
        with weights_only_torch_load():
            yield
    except Exception as e:  # noqa: BLE001  (re-raised unless it is the unpickler's)
        needs = refused_global(e)
        if needs is not None:
            raise CheckpointRefused(refusal_message(what, needs)) from None
        failure = unpickling_failure(e)
        if failure is None:
            raise
        unsupported = unsupported_pickle(what, path, failure)
        if unsupported is not None:
            raise unsupported from None
        # a damaged or foreign file: the caller reports an UnpicklingError as a file that cannot be read
        raise pickle.UnpicklingError(f"the weights-only unpickler stopped: {failure}") from e


def load(path, what: str = None, map_location="cpu"):
    """``torch.load(path)`` of a checkpoint through :func:`checkpoint_loading`, its options that fairseq evaluates
    checked to be literals (:func:`fairseq_pe.compat.literal_options.check_options`)."""
    import torch

    from fairseq_pe.compat.literal_options import check_options

    what = what or f"checkpoint {path}"
    with checkpoint_loading(what, path):
        state = torch.load(path, map_location=map_location)
    return check_options(state, what)
