"""Fix: a hub archive is extracted only inside its folder, and the user's archive is never deleted.

fairseq 0.12's ``file_utils.load_archive_file`` (the hub's ``from_pretrained("model.tar.gz")``) extracts with
``tarfile.extractall`` and no filter, so a member named ``../../x`` (or an absolute path, or a link out) is written
outside the temporary folder (a ``.pth`` in site-packages runs at the next Python start); then it deletes the archive
and moves the extracted folder to its path, which for a local archive is the user's own file.

Here the archive is extracted with Python's ``tarfile`` data filter (PEP 706: no absolute paths, no ``..`` out of the
folder, no links out, no device files); a member the filter refuses is one line naming the archive and the member
(:class:`~fairseq_pe.errors.UserError`).  A local archive stays where it is: it is extracted into a new temporary
folder, removed when the process ends.  A downloaded archive in fairseq's cache is replaced by its folder there, as
fairseq does (the cache is fairseq's own).

Extension point: none; fairseq 0.12 calls ``extractall`` in ``load_archive_file`` (a wrapper, once).
"""

import atexit
import functools
import logging
import os
import shutil
import tarfile
import tempfile

from fairseq_pe.compat.patching import fairseq_matches, patch
from fairseq_pe.errors import UserError

FIXES_FAIRSEQ = ("0.12.",)
CHANGES_STOCK = True
SUMMARY = "hub archives extract inside their folder only (tarfile's data filter) and the user's archive is kept"

logger = logging.getLogger("fairseq_pe")


def extract(archive: str, mode: str) -> str:
    """``archive`` extracted into a new temporary folder with the data filter: the path of its top folder (or of
    its one file), as fairseq's ``load_archive_file`` finds it (the common prefix of the members' names)."""
    folder = tempfile.mkdtemp(prefix="fairseq-pe-archive-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    try:
        with tarfile.open(archive, mode) as tar:
            top = os.path.commonprefix(tar.getnames())
            tar.extractall(folder, filter="data")
    except tarfile.FilterError as e:
        shutil.rmtree(folder, ignore_errors=True)
        member = getattr(getattr(e, "tarinfo", None), "name", "?")
        raise UserError(f"archive {archive}: refused: its member {member!r} would be extracted outside the "
                        f"archive's folder or is not a plain file or folder ({e})") from None
    except (tarfile.TarError, OSError) as e:
        shutil.rmtree(folder, ignore_errors=True)
        raise UserError(f"archive {archive} cannot be extracted ({type(e).__name__}: {e})") from None
    path = os.path.realpath(os.path.join(folder, top))
    if os.path.commonpath([path, os.path.realpath(folder)]) != os.path.realpath(folder):
        raise UserError(f"archive {archive}: refused: its top folder {top!r} is outside the archive's folder")
    return path


def _load_archive_safely(load_archive_file):
    @functools.wraps(load_archive_file)
    def wrapper(archive_file):
        from fairseq import file_utils

        try:
            resolved = file_utils.cached_path(archive_file, cache_dir=None)
        except EnvironmentError:
            return load_archive_file(archive_file)  # fairseq's own message, and None
        if os.path.isdir(resolved):
            return resolved
        mode = "r:" + os.path.splitext(archive_file)[1][1:]
        logger.info(f"extracting archive file {resolved} (kept) into a temporary folder")
        extracted = extract(resolved, mode)
        if os.path.abspath(resolved) == os.path.abspath(archive_file):
            return extracted  # the user's own file: left where it is
        os.remove(resolved)  # fairseq's cache entry of a download: its folder takes its place, as in fairseq
        shutil.move(extracted, resolved)
        return resolved

    wrapper._fairseq_pe_patched = True
    return wrapper


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "archive_extraction",
                           "hub archives are extracted without a filter and the archive is deleted"):
        return False
    from fairseq import file_utils

    patch(file_utils, "load_archive_file", _load_archive_safely)
    return True
