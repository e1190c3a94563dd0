"""Checkpoints load without running code (issue 40, 4; :mod:`fairseq_pe.safe_load`).

* The allowlist is what real checkpoints hold, no more: the globals that torch's weights-only unpickler does not
  know in checkpoints of stock fairseq 0.12 (``fairseq-train --arch transformer`` without the plugin, with EMA), of
  the plugin (KERPLE with EMA through ``fairseq-train``; KERPLE under ``--fp16``, RoPE with randomised positions
  under ``--bf16`` and FLOATER's refresh through fairseq's Trainer: their resume state), of ``tests/fixtures/``, and
  in the copy a resumed distributed training broadcasts, are exactly the allowlist; each loads with it as it loads
  trusted (``weights_only=False``).
* A checkpoint whose pickle runs a command (``os.system("touch MARKER")`` through ``__reduce__``) is refused, in one
  line naming the global and ``FAIRSEQ_PE_TRUST_CHECKPOINTS``, with exit status 2, and MARKER is never made: by
  ``fairseq-generate --path``, ``fairseq-train --restore-file`` and ``--ema-seed-model`` (command lines),
  ``fairseq-pe-analyze``, ``fairseq-pe-average-checkpoints``, ``fairseq-pe-warm-start-floater`` (their ``main`` in
  this process), the hub's ``from_pretrained`` and the resume broadcast.  With the variable set it is trusted (the
  command runs: MARKER is made); torch's ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` does not trust it.  In every pickle
  protocol (0-5), torch's zip format or its legacy one, the refusal names the global (issue 55, 7: protocols 0, 1,
  4 and 5 stopped torch's unpickler at an opcode it does not read, reported as a truncated file); a legitimate
  checkpoint pickled with protocol 4 is refused naming the protocol to re-save it with.
* Legitimate checkpoints load through ``fairseq-generate --path`` (stock fairseq's), averaging and the hub; the
  allowlist is scoped (torch's own ``torch.load`` and a caller's ``add_safe_globals`` are as they were).  The
  fixtures, analysis, the warm starts, ``--restore-file``, ``--ema-seed-model`` and the multi-process resume load
  legitimate checkpoints in their own tests (test_checkpoints_before_the_move.py, test_analysis_cli.py,
  test_floater_warm_start.py, test_resume.py, test_fairseq_features_cli.py, test_kerple_resume.py).
"""

import argparse
import glob
import io
import os
import re

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils

from fairseq_pe import safe_load

from helpers import FIXTURES, PLUGIN, assert_user_error, cli, exit_status, synthetic_data_bin
from training import TINY, batch, build_trainer, dictionary_dir

STOCK_SIZES = TINY[2:]  # fairseq's own transformer at the tests' tiny sizes
TRAIN = ["--optimizer", "adam", "--lr", "0.001", "--max-tokens", "400", "--cpu", "--num-workers", "0", "--seed", "1",
         "--log-format", "simple", "--disable-validation", "--no-epoch-checkpoints"]
PLUGIN_FLAGS = [*TINY, "--pe-absolute", "none", "--pe-relative", "kerple-log"]
#: what the payload runs; the global its pickle names (os.system is posix.system on Linux)
SYSTEM = f"{os.system.__module__}.system"


class Payload:
    """Unpickled, it runs ``command`` (what a malicious checkpoint does)."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic_data_bin(tmp_path_factory.mktemp("safe_load"), train_size=40, valid_size=4,
                              test_buckets=[(2, 6)], test_per_bucket=3, seed=3)


@pytest.fixture(scope="module")
def checkpoints(data, tmp_path_factory):
    """Stock fairseq's transformer and the plugin's KERPLE (both with EMA), trained 2 updates by fairseq-train
    (the plugin's saved after each update), and the malicious copy of the plugin's last checkpoint."""
    root = tmp_path_factory.mktemp("checkpoints")
    cli("fairseq-train", data, "--arch", "transformer", *STOCK_SIZES, *TRAIN, "--store-ema", "--ema-decay", "0.9",
        "--max-update", "2", "--save-dir", str(root / "stock"))  # no --user-dir: stock fairseq 0.12
    cli("fairseq-train", data, "--user-dir", PLUGIN, *PLUGIN_FLAGS, *TRAIN, "--store-ema", "--ema-decay", "0.9",
        "--max-update", "2", "--save-interval-updates", "1", "--save-dir", str(root / "plugin"))
    marker = root / "MARKER"
    state = torch.load(root / "plugin" / "checkpoint_last.pt", weights_only=False)  # the test's own output
    state["extra_state"]["payload"] = Payload(f"touch {marker}")
    torch.save(state, root / "evil.pt")
    return {"stock": str(root / "stock" / "checkpoint_last.pt"), "plugin": str(root / "plugin" / "checkpoint_last.pt"),
            "plugin-1": str(root / "plugin" / "checkpoint_1_1.pt"), "evil": str(root / "evil.pt"), "marker": marker,
            "root": root}


@pytest.fixture
def untrusted(monkeypatch):
    monkeypatch.delenv(safe_load.TRUST_ENV, raising=False)


def global_name(entry) -> str:
    """The name a pickle gives an allowlist entry (a function, or a (function, name) pair)."""
    return entry[1] if isinstance(entry, tuple) else f"{entry.__module__}.{entry.__qualname__}"


def allowlisted_names():
    return {global_name(g) for g in safe_load.checkpoint_globals()}


def same(a, b) -> bool:
    """``a`` and ``b`` hold the same values (tensors equal, in dtype too; configurations by their content)."""
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) or hasattr(a, "keys"):
        return set(a.keys()) == set(b.keys()) and all(same(a[k], b[k]) for k in a.keys())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, argparse.Namespace):
        return isinstance(b, argparse.Namespace) and same(vars(a), vars(b))
    return type(a) is type(b) and a == b


def broadcast_payload(state) -> io.BytesIO:
    """What rank 0 of a resumed distributed training sends the others (fairseq's ``broadcast_object``: the state
    fairseq's loader returned, its tensors replaced by placeholders, ``torch.save``'d)."""
    buffer = io.BytesIO()
    torch.save(distributed_utils._split_tensors_from_obj(state, []), buffer)
    buffer.seek(0)
    return buffer


def trainer_checkpoints(tmp_path):
    """Checkpoints of fairseq's Trainer after one update: their resume state (float32 masters, loss scaler,
    FLOATER's reused solution)."""
    data = dictionary_dir(tmp_path)
    variants = {"kerple-fp16": ["--pe-absolute", "none", "--pe-relative", "kerple-power", "--fp16"],
                "rope-random-bf16": ["--pe-absolute", "none", "--pe-relative", "rope", "--pe-random-positions", "64",
                                     "--bf16"],
                "floater-refresh": ["--pe-absolute", "floater", "--pe-all-blocks", "--pe-floater-refresh-updates", "2"]}
    paths = []
    for name, flags in variants.items():
        trainer = build_trainer(data, *TINY, *flags)
        assert trainer.train_step([batch(trainer.task.source_dictionary, [6, 4], [5, 3])]) is not None
        trainer.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does first
        path = str(tmp_path / f"{name}.pt")
        trainer.save_checkpoint(path, {"train_iterator": {"epoch": 1, "iterations_in_epoch": 1, "version": 2,
                                                          "shuffle": False}})
        paths.append(path)
    return paths


def test_the_allowlist_is_what_real_checkpoints_hold(checkpoints, tmp_path, monkeypatch, untrusted,
                                                     cpu_fp16_optimizer):
    files = [checkpoints["stock"], checkpoints["plugin"], *trainer_checkpoints(tmp_path),
             *sorted(glob.glob(os.path.join(FIXTURES, "checkpoints-0.1*", "**", "checkpoint.pt"), recursive=True))]
    assert len(files) == 8
    needed = set()
    for path in files:
        needed.update(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        state = checkpoint_utils.load_checkpoint_to_cpu(path)  # weights_only=True with the allowlist
        with monkeypatch.context() as trusting:
            trusting.setenv(safe_load.TRUST_ENV, "1")
            trusted = checkpoint_utils.load_checkpoint_to_cpu(path)  # weights_only=False, as before
        assert same(state, trusted), path
        payload = broadcast_payload(state)
        needed.update(torch.serialization.get_unsafe_globals_in_checkpoint(payload))
        payload.seek(0)
        with safe_load.checkpoint_loading("the broadcast"):
            received = torch.load(payload, map_location="cpu")
        assert received["cfg"] == state["cfg"] and received["cfg"]["model"] == state["cfg"]["model"]
    # every entry is needed by one of them, and nothing else is; numpy's scalars are needed by a fine-tuned
    # sentence_prediction checkpoint's best metric, which tests/test_glue.py loads through fairseq-pe-glue-eval
    numpy = {global_name(g) for g in safe_load.numpy_scalar_globals()}
    assert needed | numpy == allowlisted_names(), (sorted(needed), sorted(allowlisted_names()))


def test_a_checkpoint_pickled_under_numpy_1_loads(tmp_path, untrusted):
    """Issue 55, 7: numpy 1.x pickled its scalars as ``numpy.core.multiarray.scalar`` (numpy 2:
    ``numpy._core``), as fine-tuned checkpoints of fairseq 0.12's era hold their best metric; refused before."""
    import zipfile

    import numpy as np

    saved = tmp_path / "numpy2.pt"
    torch.save({"model": {}, "extra_state": {"best": np.float64(0.75)}}, saved)
    old = tmp_path / "numpy1.pt"
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("data.pkl"):
                assert b"numpy._core.multiarray" in data
                data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
            dst.writestr(item, data)
    assert "numpy.core.multiarray.scalar" in torch.serialization.get_unsafe_globals_in_checkpoint(str(old))
    state = safe_load.load(str(old))
    assert state["extra_state"]["best"] == 0.75


def test_the_allowlist_is_scoped(checkpoints, untrusted):
    before = set(torch.serialization.get_safe_globals())
    checkpoint_utils.load_checkpoint_to_cpu(checkpoints["plugin"])
    assert set(torch.serialization.get_safe_globals()) == before
    with pytest.raises(Exception, match="Unsupported global: GLOBAL argparse.Namespace"):
        torch.load(checkpoints["plugin"])  # torch's own default, outside the plugin's loads
    with torch.serialization.safe_globals([argparse.Namespace]):  # a caller's allowlist stays after a load
        checkpoint_utils.load_checkpoint_to_cpu(checkpoints["plugin"])
        assert argparse.Namespace in torch.serialization.get_safe_globals()


def assert_refused(proc, prog, marker):
    assert_user_error(proc, prog, SYSTEM, f"{safe_load.TRUST_ENV}=1", "refused")
    assert not marker.exists()


@pytest.mark.parametrize("entry", ["generate", "restore-file", "ema-seed-model"])
def test_fairseq_refuses_the_malicious_checkpoint(entry, data, checkpoints, tmp_path, untrusted):
    """fairseq's own command lines, where fairseq's code calls the loader (``--finetune-from-model`` loads through
    ``--restore-file``'s ``Trainer.load_checkpoint``)."""
    evil = checkpoints["evil"]
    if entry == "generate":
        proc = cli("fairseq-generate", data, "--user-dir", PLUGIN, "--path", evil, "--gen-subset", "test", "--cpu",
                   "--beam", "1", "--max-len-b", "3", check=False)
    else:
        extra = ["--store-ema", "--ema-seed-model", evil] if entry == "ema-seed-model" else ["--restore-file", evil]
        proc = cli("fairseq-train", data, "--user-dir", PLUGIN, *PLUGIN_FLAGS, *TRAIN, "--max-update", "1",
                   "--save-dir", str(tmp_path / "out"), *extra, check=False)
    assert_refused(proc, "fairseq-generate" if entry == "generate" else "fairseq-train", checkpoints["marker"])
    what = f"--ema-seed-model {evil}" if entry == "ema-seed-model" else f"checkpoint {evil}"
    assert f"{what}: refused" in proc.stderr


@pytest.mark.parametrize("tool", ["analyze", "average", "warm-start-floater"])
def test_the_plugins_tools_refuse_the_malicious_checkpoint(tool, checkpoints, tmp_path, capsys, untrusted):
    from fairseq_pe import average_checkpoints
    from fairseq_pe.analysis import cli as analyze
    from fairseq_pe.warm_start import floater

    evil, out = checkpoints["evil"], str(tmp_path / "out")
    main, argv, prog = {
        "analyze": (analyze.main, [evil, "--out", out], "fairseq-pe-analyze"),
        "average": (average_checkpoints.main, ["--inputs", checkpoints["plugin"], evil, "--output", out],
                    "fairseq-pe-average-checkpoints"),
        "warm-start-floater": (floater.cli_main, [evil, out], "fairseq-pe-warm-start-floater")}[tool]
    assert exit_status(main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "".join(err) and err[-1].startswith(f"{prog}: error: "), err[-3:]
    assert SYSTEM in err[-1] and f"{safe_load.TRUST_ENV}=1" in err[-1] and evil in err[-1], err[-1]
    assert not checkpoints["marker"].exists() and not os.path.exists(out)


def test_the_hub_and_the_resume_broadcast_refuse_it(data, checkpoints, monkeypatch, untrusted):
    from fairseq.models.transformer import TransformerModel

    root, marker = checkpoints["root"], checkpoints["marker"]
    with pytest.raises(safe_load.CheckpointRefused, match=re.escape(SYSTEM)):
        TransformerModel.from_pretrained(str(root), checkpoint_file="evil.pt", data_name_or_path=data)
    assert not marker.exists()

    # rank 1 of a resumed distributed training receives rank 0's pickle (fairseq's own receiving code, the
    # collective replaced by the bytes of a malicious one)
    sent = io.BytesIO()
    torch.save({"cfg": None, "payload": Payload(f"touch {marker}")}, sent)
    pieces = [torch.LongTensor([len(sent.getvalue())]), torch.ByteTensor(list(sent.getvalue()))]

    def receive(tensor, src, group):
        tensor.copy_(pieces.pop(0))

    monkeypatch.setattr(distributed_utils, "get_rank", lambda group: 1)
    monkeypatch.setattr(distributed_utils, "broadcast", receive)
    with pytest.raises(safe_load.CheckpointRefused, match=re.escape(SYSTEM)):
        distributed_utils.broadcast_object(None, src_rank=0, group=None, dist_device=torch.device("cpu"))
    assert not marker.exists()


def test_trusted_by_the_environment_variable_only(checkpoints, monkeypatch, untrusted):
    marker = checkpoints["marker"]
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch's switch does not turn the check off
    with pytest.raises(safe_load.CheckpointRefused):
        checkpoint_utils.load_checkpoint_to_cpu(checkpoints["evil"])
    assert not marker.exists()
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    monkeypatch.setenv(safe_load.TRUST_ENV, "1")  # read at each load, not when the plugin was imported
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(checkpoints["evil"])
        assert marker.exists() and state["extra_state"]["payload"] == 0  # os.system's status: the command ran
    finally:
        marker.unlink(missing_ok=True)


def test_loads_in_threads_neither_leak_trust_nor_refuse_good_files(checkpoints, monkeypatch, untrusted):
    """Issue 55, 3: two threads load at once, one the good checkpoint and one the malicious, with torch's
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` set as people set it for stock fairseq.  Before (the policy an
    environment variable set and restored per load, no lock) the payload ran after 2.1 s and the good file was
    refused 5 times in 30 s; the process environment is left as it was."""
    import threading
    import time

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    before = dict(os.environ)
    failures, refused, loaded = [], [], []
    stop = time.monotonic() + 3.0

    def good():
        while time.monotonic() < stop:
            try:
                loaded.append(checkpoint_utils.load_checkpoint_to_cpu(checkpoints["plugin"])["cfg"] is not None)
            except Exception as e:  # noqa: BLE001 (reported below)
                failures.append(e)

    def evil():
        while time.monotonic() < stop:
            try:
                checkpoint_utils.load_checkpoint_to_cpu(checkpoints["evil"])
                failures.append("the malicious checkpoint loaded")
            except safe_load.CheckpointRefused:
                refused.append(1)

    threads = [threading.Thread(target=good), threading.Thread(target=evil)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]
    assert not checkpoints["marker"].exists()
    assert loaded and all(loaded) and refused
    assert dict(os.environ) == before
    assert getattr(safe_load._policy, "weights_only", None) is None  # this thread's policy: none outside a load


@pytest.mark.parametrize("case", ["typo", "folder", "dangling-link", "link-loop", "finetune-folder"])
def test_a_restore_file_that_is_no_file_never_trains_over_the_save_dir(case, data, checkpoints, tmp_path):
    """Issue 55, 4: ``--restore-file`` naming no file (a typo, a folder, a dangling or looping link), or
    ``--finetune-from-model`` naming a folder: before, exit 0, "No existing checkpoint found", training from scratch
    and ``--save-dir``'s ``checkpoint_last.pt`` overwritten (3 updates -> 1).  Now one line naming the option, exit
    2, and the save dir's checkpoint as it was."""
    import shutil

    save = tmp_path / "S"
    shutil.copytree(os.path.dirname(checkpoints["plugin"]), save)
    last = save / "checkpoint_last.pt"
    before = last.read_bytes()
    target = tmp_path / "S2" / "typo.pt"
    if case == "folder" or case == "finetune-folder":
        target = tmp_path / "folder"
        target.mkdir()
    elif case == "dangling-link":
        target = tmp_path / "dangling.pt"
        target.symlink_to(tmp_path / "nowhere.pt")
    elif case == "link-loop":
        target = tmp_path / "loop.pt"
        target.symlink_to(target)
    flag = "--finetune-from-model" if case == "finetune-folder" else "--restore-file"
    if case == "finetune-folder":  # fine-tuning starts from it on a first launch only: a new save dir
        save = tmp_path / "S3"
    proc = cli("fairseq-train", data, "--user-dir", PLUGIN, *PLUGIN_FLAGS, *TRAIN, "--max-update", "3",
               "--save-dir", str(save), flag, str(target), check=False)
    why = {"typo": "no such file", "folder": "is a folder", "dangling-link": "is a dangling symbolic link",
           "link-loop": "is a symbolic link loop", "finetune-folder": "is a folder"}[case]
    assert_user_error(proc, "fairseq-train", f"{flag} {target}: {why}")
    assert last.read_bytes() == before
    if case == "finetune-folder":
        assert not (save / "checkpoint_last.pt").exists()


def test_legitimate_checkpoints_load_through_the_entry_points(data, checkpoints, tmp_path, capsys, untrusted):
    from fairseq.models.transformer import TransformerModel

    from fairseq_pe import average_checkpoints

    out = cli("fairseq-generate", data, "--user-dir", PLUGIN, "--path", checkpoints["stock"], "--gen-subset", "test",
              "--cpu", "--beam", "1", "--max-len-a", "0", "--max-len-b", "3").stdout  # stock fairseq's checkpoint
    assert len(re.findall(r"^H-\d+\t", out, re.M)) == 3
    assert exit_status(average_checkpoints.main, ["--inputs", checkpoints["plugin"], checkpoints["plugin-1"],
                                                  "--output", str(tmp_path / "avg.pt")]) == 0
    hub = TransformerModel.from_pretrained(os.path.dirname(checkpoints["plugin"]), checkpoint_file="checkpoint_last.pt",
                                           data_name_or_path=data)
    assert hub.models[0].args.pe_relative == "kerple-log"


def test_damaged_files_are_still_unreadable_files(tmp_path, untrusted):
    text = tmp_path / "notes.pt"
    text.write_text("hello\n")
    from fairseq_pe.errors import UserError

    with pytest.raises(UserError, match="cannot be read .*weights-only unpickler stopped") as e:
        checkpoint_utils.load_checkpoint_to_cpu(str(text))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_a_payload_in_every_pickle_protocol_is_refused_naming_what_it_needs(protocol, zip_format, tmp_path,
                                                                               untrusted):
    marker, path = tmp_path / "MARKER", tmp_path / "evil.pt"
    torch.save({"model": {}, "cfg": None, "payload": Payload(f"touch {marker}")}, path, pickle_protocol=protocol,
               _use_new_zipfile_serialization=zip_format)
    with pytest.raises(safe_load.CheckpointRefused, match=rf"evil\.pt: refused: its pickle needs {SYSTEM}, ") as e:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert "truncated" not in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


def test_a_good_checkpoint_pickled_with_protocol_4_is_refused_naming_the_protocol(tmp_path, untrusted):
    path = tmp_path / "p4.pt"
    torch.save({"model": {"w": torch.ones(2)}, "cfg": None}, path, pickle_protocol=4)
    with pytest.raises(safe_load.CheckpointRefused, match="it is pickled with protocol 4, whose FRAME torch's "
                                                          "weights-only unpickler does not read; re-save it"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert safe_load.pickle_contents(str(path))[2] <= {"torch._utils._rebuild_tensor_v2", "collections.OrderedDict",
                                                       "torch.FloatStorage"}
