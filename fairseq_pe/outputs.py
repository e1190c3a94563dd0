"""Writing results into the user's paths without ever losing data.

Every ``fairseq-pe-*`` tool that writes a checkpoint or results into a path the user gave

* refuses to write over one of its inputs (:func:`check_not_inputs`: the same file, also through
  a symbolic or hard link), whatever the options;
* refuses to replace a file an earlier run wrote unless ``--force`` is given
  (:func:`check_new_file`, :func:`check_new_files`);
* writes atomically (:func:`atomic_path`, :func:`atomic_open`, :func:`write_text`,
  :func:`write_json`): the data goes to a hidden temporary file in the destination's folder,
  which replaces the destination (``os.replace``) only once it is complete.  An interrupted or
  failed write leaves the old file as it was and no half file; the temporary file is removed.

The checks raise :class:`~fairseq_pe.errors.UserError` naming the option to change.
"""

import contextlib
import hashlib
import json
import os
import tempfile
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from fairseq_pe.errors import UserError

FORCE = "--force"

#: an input: its path, or (how the user gave it, e.g. "--corpus", and its path)
Input = Union[str, Tuple[str, str]]


def _read_umask() -> int:
    """The process umask, read without changing it where /proc tells it (threads may be writing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def same_file(a: str, b: str) -> bool:
    """Whether two paths name the same file: the same inode when both exist (links included), else
    the same real path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _inputs(inputs: Iterable[Input]) -> List[Tuple[str, str]]:
    out = []
    for item in inputs:
        if item is None:
            continue
        label, path = item if isinstance(item, tuple) else (None, item)
        if path:
            out.append((label, str(path)))
    return out


def describe(label: Optional[str], path: str) -> str:
    """``--flag PATH`` (``NAME=PATH`` when the label ends with ``=``), or the bare path."""
    if not label:
        return path
    return f"{label}{path}" if label.endswith("=") else f"{label} {path}"


def check_not_inputs(outputs: Iterable[str], inputs: Iterable[Input], flag: str = "--out"):
    """Refuse (always, ``--force`` or not) an output that is one of the inputs."""
    inputs = _inputs(inputs)
    for out in outputs:
        for label, path in inputs:
            if same_file(out, path):
                where = f" ({out})" if os.path.abspath(out) != os.path.abspath(path) else ""
                raise UserError(f"{flag}: would write over the input {describe(label, path)}{where}; "
                                f"choose another {flag}")


def check_new_file(path: str, force: bool = False, flag: str = "--out", inputs: Iterable[Input] = ()):
    """An output file: not one of ``inputs``, not a folder, and new unless ``force``."""
    check_not_inputs([path], inputs, flag)
    if os.path.isdir(path):
        raise UserError(f"{flag} {path} is a folder, not a file")
    if os.path.lexists(path) and not force:
        raise UserError(f"{flag} {path} exists already: pass {FORCE} to replace it, or choose another {flag}")


def check_new_files(paths: Sequence[str], force: bool = False, flag: str = "--out",
                    inputs: Iterable[Input] = (), where: Optional[str] = None):
    """Several output files (e.g. a folder's or a prefix's): none is an input, and none exists
    unless ``force``; the error lists the files of an earlier run that would be replaced."""
    check_not_inputs(paths, inputs, flag)
    existing = [p for p in paths if os.path.lexists(p)]
    if existing and not force:
        shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
        raise UserError(f"{flag} {where or os.path.dirname(existing[0]) or '.'}: {shown} "
                        f"{'exists' if len(existing) == 1 else 'exist'} already (an earlier run's results): "
                        f"pass {FORCE} to replace {'it' if len(existing) == 1 else 'them'}, or choose another {flag}")


def _fsync(path: str):
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path in ``path``'s folder (hidden, same extension, so that ``torch.save``,
    ``numpy.savez`` and matplotlib's ``savefig`` treat it alike) to write to; it replaces ``path``
    when the block ends normally and is removed when it raises (``KeyboardInterrupt`` too).
    The folder is created if needed.  A symbolic link is written through (its target is replaced);
    an existing target that is no regular file (``/dev/null``, a pipe) is written directly."""
    if os.path.islink(path):
        path = os.path.realpath(path)
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        yield path  # a device or a pipe cannot be replaced (and must not be)
        return
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    stem, ext = os.path.splitext(os.path.basename(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", suffix=f".part{ext}", dir=folder)
    os.close(fd)
    try:
        # mkstemp's 0600 would become the result's mode: give it what open() would have
        os.chmod(tmp, 0o666 & ~_UMASK)
        yield tmp
        if not os.path.exists(tmp):
            raise FileNotFoundError(f"nothing was written to {tmp} (for {path})")
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", encoding: str = "utf-8", newline: Optional[str] = None):
    """``open(path, mode)`` (``"w"`` or ``"wb"``) that writes atomically (see :func:`atomic_path`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', not {mode!r}")
    with atomic_path(path) as tmp:
        kwargs = {} if "b" in mode else {"encoding": encoding, "newline": newline}
        with open(tmp, mode, **kwargs) as f:
            yield f


def write_text(path: str, text: str, encoding: str = "utf-8"):
    with atomic_open(path, "w", encoding=encoding, newline="\n") as f:
        f.write(text)


def write_json(path: str, obj, indent: int = 1, **kwargs):
    with atomic_open(path, "w", newline="\n") as f:
        json.dump(obj, f, indent=indent, **kwargs)
        f.write("\n")


def save_torch(obj, path: str):
    """``torch.save`` written atomically."""
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def savefig(fig, path: str, **kwargs):
    """matplotlib's ``fig.savefig`` written atomically."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, **kwargs)


def train_sentencepiece(prefix: str, **options) -> str:
    """sentencepiece's trainer writing ``PREFIX.model`` and ``PREFIX.vocab`` atomically.

    It trains under ``PREFIX.part`` and renames both files once complete, so a half model is never
    used; on failure the partial files are removed and the exception propagates (sentencepiece
    reports a bad option, or a vocabulary too large for the text, as ``RuntimeError``).
    """
    import sentencepiece as spm

    part = prefix + ".part"
    try:
        spm.SentencePieceTrainer.train(model_prefix=part, **options)
    except BaseException:
        for ext in (".model", ".vocab"):
            if os.path.exists(part + ext):
                os.remove(part + ext)
        raise
    os.replace(part + ".vocab", prefix + ".vocab")
    os.replace(part + ".model", prefix + ".model")
    return prefix + ".model"


def file_digest(path: str, algorithm: str = "sha1") -> str:
    """The hex digest of a file's bytes (hashlib's ``algorithm``), read a MiB at a time."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
