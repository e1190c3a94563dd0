"""No user error loses data (issue 14): outputs are never written over inputs, results of an earlier
run are replaced only with --force, and every write is atomic (an interrupted one leaves the old file
and no temporary file).  The checks of fairseq_pe.outputs, then the two checkpoint converters through
their console scripts (the other tools: in their own test files)."""

import os
import stat
import sys

import numpy as np
import pytest
import torch

from fairseq_pe import outputs
from fairseq_pe.errors import UserError
from fairseq_pe.outputs import (atomic_open, atomic_path, check_new_file, check_new_files, check_not_inputs,
                                save_torch, savefig, write_json, write_text)

from helpers import REPO, cli


class Interrupted(Exception):
    pass


def listing(folder):
    return sorted(os.listdir(folder))


# ---------------------------------------------------------------------------------------------
# the checks


def test_an_output_that_is_an_input_is_refused_even_with_force(tmp_path):
    data = tmp_path / "ckpt.pt"
    data.write_bytes(b"trained weights")
    os.symlink(data, tmp_path / "link.pt")
    os.link(data, tmp_path / "hard.pt")
    for out in (data, tmp_path / "link.pt", tmp_path / "hard.pt", tmp_path / "sub" / ".." / "ckpt.pt"):
        for force in (False, True):
            with pytest.raises(UserError, match=r"^OUTPUT: would write over the input CHECKPOINT .*ckpt\.pt"):
                check_new_file(str(out), force, flag="OUTPUT", inputs=[("CHECKPOINT", str(data))])
    assert data.read_bytes() == b"trained weights"
    check_new_file(str(tmp_path / "new.pt"), flag="OUTPUT", inputs=[("CHECKPOINT", str(data))])  # a new path: fine


def test_an_existing_output_needs_force(tmp_path):
    out = tmp_path / "res.json"
    out.write_text("old")
    with pytest.raises(UserError, match=r"^--out .*res\.json exists already: pass --force to replace it"):
        check_new_file(str(out))
    check_new_file(str(out), force=True)
    with pytest.raises(UserError, match="is a folder"):
        check_new_file(str(tmp_path), force=True)
    files = [str(tmp_path / f"res{ext}") for ext in (".txt", ".json", ".png")]
    with pytest.raises(UserError, match=r"--out res: .*res\.json exists already .*pass --force to replace it"):
        check_new_files(files, where="res")
    (tmp_path / "res.png").write_text("old")
    with pytest.raises(UserError, match=r"res\.json, .*res\.png exist already .*pass --force to replace them"):
        check_new_files(files, where="res")
    check_new_files(files, force=True)
    assert out.read_text() == "old"  # checks never write
    with pytest.raises(UserError, match=r"--out: would write over the input --system a=.*res\.json"):
        check_not_inputs(files, [("--system a=", str(out))])


# ---------------------------------------------------------------------------------------------
# atomic writes


def test_atomic_writes_replace_complete_files(tmp_path):
    target = tmp_path / "sub" / "scores.json"  # the folder is created
    write_json(str(target), {"bleu": 1.5})
    assert target.read_text() == '{\n "bleu": 1.5\n}\n'
    write_text(str(target), "new\n")
    assert target.read_text() == "new\n"
    with atomic_open(str(tmp_path / "b.bin"), "wb") as f:
        f.write(b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    # the mode a plain open() would give (mkstemp's 0600 is not kept)
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o666 & ~mask
    assert listing(tmp_path) == ["b.bin", "sub"] and listing(tmp_path / "sub") == ["scores.json"]


@pytest.mark.parametrize("error", [Interrupted, KeyboardInterrupt])
def test_an_interrupted_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path, error):
    target = tmp_path / "results.txt"
    target.write_text("the earlier results\n")
    with pytest.raises(error):
        with atomic_open(str(target)) as f:
            f.write("half of the new resu")
            raise error()
    assert target.read_text() == "the earlier results\n"
    assert listing(tmp_path) == ["results.txt"]
    # a first write that fails leaves nothing at all
    with pytest.raises(error):
        with atomic_path(str(tmp_path / "new.npz")) as tmp:
            np.savez_compressed(tmp, a=np.zeros(3))
            raise error()
    assert listing(tmp_path) == ["results.txt"]


def test_torch_numpy_and_matplotlib_write_through_the_temporary_path(tmp_path, monkeypatch):
    ckpt = tmp_path / "model.pt"
    save_torch({"w": torch.arange(3)}, str(ckpt))
    assert torch.equal(torch.load(ckpt)["w"], torch.arange(3))
    with atomic_path(str(tmp_path / "m.npz")) as tmp:  # numpy keeps a name that ends with .npz
        np.savez_compressed(tmp, a=np.ones(2))
    assert np.load(tmp_path / "m.npz")["a"].tolist() == [1.0, 1.0]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    savefig(fig, str(tmp_path / "plot.png"), dpi=50)  # the format follows the extension, kept on the temporary
    plt.close(fig)
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert listing(tmp_path) == ["m.npz", "model.pt", "plot.png"]

    # torch.save interrupted half-way (a full disk, a kill): the old checkpoint is intact
    before = ckpt.read_bytes()

    def broken_save(obj, path):
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="No space left"):
        save_torch({"w": torch.zeros(3)}, str(ckpt))
    assert ckpt.read_bytes() == before and listing(tmp_path) == ["m.npz", "model.pt", "plot.png"]


def test_nothing_written_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing was written"):
        with atomic_path(str(tmp_path / "x.png")) as tmp:
            os.remove(tmp)  # a writer that failed silently
    assert listing(tmp_path) == []


def test_umask_is_read_without_changing_it():
    mask = os.umask(0o027)
    try:
        assert outputs._read_umask() == 0o027
    finally:
        os.umask(mask)


# ---------------------------------------------------------------------------------------------
# the two checkpoint converters, through their console scripts


def run(*cmd):
    return cli(*cmd, check=False)


def assert_one_line_error(proc, prog, *fragments):
    """``PROG: error: ...`` on one line, exit status 2, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith(f"{prog}: error: "), proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


CONVERTERS = [
    # the script runs the console script's main: errors name the tool (fairseq_pe.errors.console_script_name)
    ([sys.executable, os.path.join(REPO, "scripts", "warm_start_floater.py")], "fairseq-pe-warm-start-floater"),
    (["fairseq-pe-warm-start-floater"], "fairseq-pe-warm-start-floater"),
    (["fairseq-pe-warm-start-roberta"], "fairseq-pe-warm-start-roberta"),
]


@pytest.mark.parametrize("cmd,prog", CONVERTERS, ids=["script", "floater", "roberta"][:len(CONVERTERS)])
def test_converters_never_write_over_their_input(tmp_path, cmd, prog):
    ckpt = tmp_path / "checkpoint_best.pt"
    ckpt.write_bytes(b"a user's trained checkpoint")
    os.symlink(ckpt.name, tmp_path / "same.pt")
    for out, extra in ((ckpt, []), (tmp_path / "same.pt", ["--force"])):  # a link to it; --force or not
        proc = run(*cmd, str(ckpt), str(out), *extra)
        assert_one_line_error(proc, prog, "OUTPUT: would write over the input CHECKPOINT", str(ckpt))
    assert ckpt.read_bytes() == b"a user's trained checkpoint"
    assert listing(tmp_path) == ["checkpoint_best.pt", "same.pt"]


@pytest.mark.parametrize("cmd,prog", CONVERTERS[1:], ids=[p for _, p in CONVERTERS[1:]])
def test_converters_refuse_an_existing_output_and_report_bad_checkpoints(tmp_path, cmd, prog):
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"not a checkpoint")
    out = tmp_path / "out.pt"
    out.write_bytes(b"an earlier conversion")
    assert_one_line_error(run(*cmd, str(ckpt), str(out)), prog, f"OUTPUT {out} exists already: pass --force")
    assert out.read_bytes() == b"an earlier conversion"
    # with --force the output may be replaced, but this input is no checkpoint: a clear error, no output touched
    assert_one_line_error(run(*cmd, str(ckpt), str(out), "--force"), prog,
                          f"CHECKPOINT {ckpt}: cannot be read as a fairseq checkpoint")
    assert out.read_bytes() == b"an earlier conversion"
    assert_one_line_error(run(*cmd, str(tmp_path / "missing.pt"), str(tmp_path / "new.pt")), prog,
                          f"CHECKPOINT {tmp_path / 'missing.pt'}: no such file")
    assert listing(tmp_path) == ["ckpt.pt", "out.pt"]


def test_links_are_written_through_and_devices_never_replaced(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old")
    os.symlink(real.name, tmp_path / "link.txt")
    write_text(str(tmp_path / "link.txt"), "new")
    assert os.path.islink(tmp_path / "link.txt") and real.read_text() == "new"
    write_text(os.devnull, "discarded")  # written into, not replaced
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
