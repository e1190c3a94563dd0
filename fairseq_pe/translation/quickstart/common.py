"""What every stage of ``fairseq-pe-quickstart`` shares: the systems it knows, its work dir's names, running a
command with its log, small file helpers."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import List, Optional, Sequence

from fairseq_pe import systems as catalogue
from fairseq_pe.errors import UserError
from fairseq_pe.outputs import atomic_path, same_file

#: fairseq_pe, for --user-dir
PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: what a work dir is recognised by, with the options its data were built with
WORK_MARKER = "quickstart.json"
#: the folders and files the quickstart writes in its work dir
WORK_ENTRIES = ("raw", "spm", "data-bin", "extra", "systems", "preprocess.log", "results.txt", "results.json",
                "results.png", "results-loss.png", WORK_MARKER)
#: --max-source/target-positions of fairseq-generate: the task sets no limit of its own, the model's
#: position tables (if any) are the only one
GENERATE_MAX_POSITIONS = 1_000_000

#: the encodings the quickstart compares by default: name -> extra fairseq-train flags (from the catalogue,
#: :mod:`fairseq_pe.systems`)
DEFAULT_SYSTEMS = catalogue.group("quickstart")

#: systems trained in two stages: name -> (the first stage's flags, its share of --max-update).  The first
#: stage's last checkpoint is converted by ``fairseq-pe-warm-start-floater`` and fine-tuned with the system's
#: flags for the rest of --max-update (a fresh optimizer, warm-up included): the same total budget
WARM_STARTED = {s.name: (list(s.warm_start[0]), s.warm_start[1]) for s in catalogue.SYSTEMS.values() if s.warm_start}

#: every system known by name: the catalogue's (--systems NAME); the defaults first
NAMED_SYSTEMS = {**DEFAULT_SYSTEMS, **{name: list(s.flags) for name, s in catalogue.SYSTEMS.items()}}

_print_lock = threading.Lock()


def log(msg: str):
    with _print_lock:
        print(f"[quickstart {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def executable(name: str) -> str:
    """A console script of this Python's environment (found even when it is not on PATH)."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else name


def run(cmd: Sequence[str], log_path: str, env=None, on_line=None):
    """Run a CLI, keep its full output in ``log_path``; raise with the log's tail on failure."""
    cmd = [executable(cmd[0])] + list(cmd[1:])
    with open(log_path, "w", encoding="utf-8") as logf:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, bufsize=1)
        for line in proc.stdout:
            logf.write(line)
            logf.flush()
            if on_line is not None:
                on_line(line)
        code = proc.wait()
    if code != 0:
        with open(log_path, encoding="utf-8") as f:
            tail = "".join(f.readlines()[-25:])
        raise RuntimeError(f"command failed ({code}): {' '.join(cmd)}\n--- last lines of {log_path} ---\n{tail}")


def count_lines(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def copy_input(src: str, dst: str):
    """Copy a user's file into the work dir (atomically; nothing to do when it is that file already)."""
    if os.path.exists(dst) and same_file(src, dst):
        return
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def read_json(path: str) -> Optional[dict]:
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"--workdir: {path} is unreadable ({e}); remove it, or choose another --workdir") from None
