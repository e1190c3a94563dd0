"""Shared helpers of the test-suite."""

import argparse
import contextlib
import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from types import SimpleNamespace

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY

import fairseq_pe  # noqa: F401  (registers the model)
from fairseq_pe import systems as catalogue
from fairseq_pe.models.transformer_pe import TransformerPEModel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(REPO, "fairseq_pe")
FIXTURES = os.path.join(REPO, "tests", "fixtures")
# The project's real-data folder (../shared/data next to the checkout; CI has it, a fresh clone does
# not).  Tests read it through shared_data() only, and carry @pytest.mark.shared_data.
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")
# The test being set up or run, kept by conftest.py so that shared_data() can check its marker.
current_test = None


def shared_data(*parts: str) -> str:
    """Path of ``../shared/data/<parts>``; skips the calling test, naming the folder, when it is
    missing (a fresh clone has no ``../shared``).  Only for tests marked ``@pytest.mark.shared_data``
    (and the fixtures they use), so that ``pytest -m shared_data`` selects every test that reads it."""
    path = os.path.join(SHARED_DATA, *parts)
    node = current_test
    if node is not None and node.get_closest_marker("shared_data") is None:
        raise AssertionError(f"{node.nodeid} reads {path} but is not marked @pytest.mark.shared_data")
    if not os.path.exists(path):
        rel = "/".join(("..", "shared", "data") + parts)
        pytest.skip(f"needs {rel}, the project's real-data folder next to the checkout "
                    f"(not found: {os.path.normpath(path)})")
    return path


def dictionary(vocab: int = 20) -> Dictionary:
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}")
    return d


def build_model(*flags: str, arch: str = "transformer_pe_tiny", vocab: int = 20, seed: int = 0, overrides=None):
    """A ``transformer_pe`` model built through its real ``add_args``/architecture path, in eval mode;
    ``overrides``: options set after parsing, as ``--model-overrides`` sets them."""
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)  # as fairseq does
    TransformerPEModel.add_args(parser)
    args = parser.parse_args(list(flags))
    for name, value in (overrides or {}).items():
        setattr(args, name, value)
    ARCH_CONFIG_REGISTRY[arch](args)
    d = dictionary(vocab)
    torch.manual_seed(seed)
    model = TransformerPEModel.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
    return model.eval(), d


def random_tokens(d: Dictionary, batch: int, length: int, seed: int = 0, left_pad=()):
    """Random non-special tokens; ``left_pad[i]`` pads row i on the left (as fairseq's source)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(d.nspecial, len(d), (batch, length), generator=g)
    for row, n in enumerate(left_pad):
        tokens[row, :n] = d.pad()
    return tokens


def assert_incremental_equals_full(model, d):
    """Step-by-step decoding (incremental state) gives the log-probs of one full decoder pass."""
    src = random_tokens(d, 3, 8, left_pad=(0, 2, 5))
    prev = random_tokens(d, 3, 7, seed=1)
    prev[:, 0] = d.eos()
    enc = model.encoder(src, torch.tensor([8, 6, 3]))
    full = model.get_normalized_probs(model.decoder(prev, encoder_out=enc), log_probs=True)
    state = {}
    for t in range(prev.shape[1]):
        step = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
        step_lp = model.get_normalized_probs(step, log_probs=True)
        torch.testing.assert_close(step_lp[:, -1], full[:, t], rtol=1e-5, atol=1e-5)


def cli(*cmd: str, cwd=None, check=True) -> subprocess.CompletedProcess:
    """Run a fairseq CLI; on failure the assertion shows its output.  The console scripts of this
    interpreter's environment come first on PATH (a virtual environment that is not activated).

    A console script of this environment (``fairseq-train``, ``fairseq-pe-analyze``, ...) runs as a process forked
    from a server that has imported torch and fairseq once (``cli_server.py``: its own argv, environment, working
    directory and output, the script's entry point and exit status); anything else, or every command when
    ``FAIRSEQ_PE_TEST_FORK=0``, in a new interpreter: a console script then runs as its installed wrapper (the
    executable in this environment's ``bin``, as a user runs it), and its name is added to :data:`FRESH_RUNS`."""
    cmd = [os.fspath(c) for c in cmd]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    script = _console_script(cmd, env["PATH"], cwd)
    if script is not None and os.environ.get("FAIRSEQ_PE_TEST_FORK", "1") != "0":
        proc = _CLI_SERVER.run(script[0], script[1], env, cwd)
        proc.args = list(cmd)
    else:
        if script is not None and script[0][1] is not None:  # the wrapper pip installed, by its path
            FRESH_RUNS.append(cmd[0])
            cmd = [script[0][0], *cmd[1:]]
        proc = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


@contextlib.contextmanager
def forked():
    """Inside the block, ``cli`` runs console scripts from the fork server even in a test of the fresh subset: for
    the steps that only set up what the test checks (a training), while the tools the test is named for in
    tests/fresh_subset.py run fresh outside it (``fairseq-train`` itself runs fresh in test_cli_server.py)."""
    with pytest.MonkeyPatch.context() as patch:  # the variable as it was afterwards, as the monkeypatch fixture does
        patch.setenv("FAIRSEQ_PE_TEST_FORK", "1")
        yield


#: the console scripts that ``cli`` ran as a new interpreter, by name, since conftest.py emptied it (each test's start)
FRESH_RUNS = []


def _console_script(cmd, path: str, cwd):
    """((its path, its entry point), its argv) if ``cmd`` runs a console script of this interpreter's environment
    that PATH finds, or a Python file with this interpreter (entry point None); else None."""
    program = cmd[0]
    if program == sys.executable and len(cmd) > 1 and cmd[1].endswith(".py"):  # ``python SCRIPT ARGS``
        file = os.path.join(cwd or os.getcwd(), cmd[1])
        return ((os.path.abspath(file), None), list(cmd[1:])) if os.path.isfile(file) else None
    found = shutil.which(program, path=path)
    if found is None or os.path.dirname(found) != os.path.dirname(sys.executable):
        return None
    entry = _console_scripts().get(program)
    return None if entry is None else ((found, entry), list(cmd))


@functools.lru_cache(maxsize=None)
def _console_scripts():
    from importlib.metadata import entry_points

    return {e.name: e.value for e in entry_points(group="console_scripts")}


#: environment variables read when an interpreter starts or torch is imported (threads, devices), which a forked run
#: would inherit from the server: a run whose values differ from the server's gets a new interpreter.  fairseq-pe
#: reads none at import (tests/test_fresh_interpreters.py checks it; FAIRSEQ_PE_TRACEBACK is read when an error is
#: reported).
READ_AT_START = ("PYTHON", "OMP_", "MKL_", "KMP_", "CUDA_", "TORCH", "PYTORCH")
#: ... but for those that torch's compiler writes into its own process's environment at its first compilation
#: (torch._inductor: its cache folder, and the OpenMP switches of its C++ kernels), which no run of ours reads at its
#: start: a test process that has compiled (tests/test_flex.py) would otherwise send every later run of its worker to
#: a new interpreter, at 4 times the time (found in the suite: tests/test_cli_e2e.py's runs took 16-20 s there, 4 s
#: alone)
SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK")


def needs_new_interpreter(env: dict, started: dict) -> bool:
    """Whether a run in ``env`` must start a new interpreter rather than fork the server started in ``started``: a
    variable read at an interpreter's start or torch's import differs (:data:`READ_AT_START`, :data:`SET_BY_TORCH`
    aside)."""
    return any(env.get(k) != started.get(k) for k in {*env, *started}
               if k.startswith(READ_AT_START) and k not in SET_BY_TORCH)


class _CliServer:
    """The fork server of this test process (one per pytest-xdist worker), started at its first use."""

    def __init__(self):
        self.proc = None
        self.env = None
        self._lock = threading.Lock()
        self.forked_runs = 0  # runs the server forked (tests/test_cli_server.py counts them)

    def run(self, script, cmd, env, cwd):
        started = self.env or _BASE_ENV
        if needs_new_interpreter(env, started):
            # read at an interpreter's start or by torch's import, which the server's would not do for this run
            argv = cmd if script[1] is not None else [sys.executable, *cmd]  # a Python file runs with this Python
            return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                # the session's environment, not the first run's (a test's variable would send every later run to
                # a new interpreter); each run's own environment is set in its child
                self.env = dict(_BASE_ENV)
                self.proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "cli_server.py")],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                             env=self.env, text=True, cwd=REPO)
            with tempfile.TemporaryDirectory() as tmp:
                out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
                request = {"argv0": script[0], "args": cmd[1:], "entry": script[1], "env": env,
                           "cwd": os.path.abspath(cwd or os.getcwd()), "stdout": out, "stderr": err}
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
                reply = self.proc.stdout.readline()
                if not reply:
                    raise AssertionError(f"the tests' fork server (tests/cli_server.py) died running {' '.join(cmd)}")
                code = json.loads(reply)["returncode"]
                self.forked_runs += 1

                def read(path):
                    with open(path, encoding="utf-8", errors="replace") as f:
                        return f.read()

                return subprocess.CompletedProcess(cmd, code, read(out), read(err))


#: the environment the fork server starts with: this session's, as ``cli`` completes it
_BASE_ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                 PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
_CLI_SERVER = _CliServer()


def assert_user_error(proc, prog, *fragments):
    """Exit status 2, no traceback, and a last stderr line ``PROG: error: ...`` holding the fragments."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{prog}: error: "), last
    for fragment in fragments:
        assert fragment in last, (fragment, last)


def analyze_in_process(capsys, *argv):
    """``fairseq-pe-analyze ARGV`` in this process: (exit status, its one error line or ""); an
    error must be one line, without a traceback."""
    from fairseq_pe.analysis import cli as tool

    try:
        code = tool.main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert "Traceback" not in err and len(errors) == (code != 0), err
    return code, "".join(errors)


def assert_pictures_and_reports(out):
    """Every picture under ``out`` is a real PNG, and every picture a report.md embeds exists."""
    import re

    from PIL import Image

    for png in out.rglob("*.png"):
        with Image.open(png) as im:
            assert im.format == "PNG" and im.size[0] > 200 and im.size[1] > 150
    for report in out.rglob("report.md"):
        embedded = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text())
        assert embedded and all((report.parent / e).is_file() for e in embedded), report


def exit_status(main, argv):
    """A console script's ``main`` in-process: its return value, or the status it exits with (a user
    error: ``SystemExit(2)`` after ``PROG: error: ...`` on stderr)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def synthetic_data_bin(root, **corpus) -> str:
    """A synthetic translation corpus (:func:`fairseq_pe.translation.synthetic.write_corpus` with ``corpus``) in
    ``root/raw``, binarised by ``fairseq-preprocess --joined-dictionary`` into ``root/bin`` (returned)."""
    from fairseq_pe.translation.synthetic import write_corpus

    raw = write_corpus(str(root / "raw"), **corpus)
    dest = str(root / "bin")
    cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train",
        "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test", "--destdir", dest, "--joined-dictionary",
        "--workers", "1")
    return dest


def training_config(*flags: str):
    """fairseq's configuration of ``fairseq-train DATA --user-dir fairseq_pe --arch transformer_pe_tiny --cpu
    --optimizer adam ... FLAGS`` (parsed by fairseq's own parser; DATA is not read)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "/nonexistent-data", "--user-dir", PLUGIN, "--arch", "transformer_pe_tiny", "--cpu", "--optimizer", "adam",
        "--lr", "0.01", *flags])
    return convert_namespace_to_omegaconf(args)


#: the fairseq-train flags of each precision
PRECISION_FLAGS = {
    "fp32": [],
    "fp16": ["--fp16"],
    "bf16": ["--bf16"],
    "memory-efficient-fp16": ["--fp16", "--memory-efficient-fp16"],
    "memory-efficient-bf16": ["--bf16", "--memory-efficient-bf16"],
}


def fairseq_optimizer(params, precision: str, *flags: str):
    """The optimizer fairseq's trainer builds for ``precision`` (:data:`PRECISION_FLAGS`): its Adam, plain, or
    wrapped by ``FP16Optimizer`` (float32 master copies; flat for --fp16) or ``MemoryEfficientFP16Optimizer``.
    On CPU, use the ``cpu_fp16_optimizer`` fixture."""
    from fairseq import optim

    cfg = training_config(*PRECISION_FLAGS[precision], *flags)
    if precision == "fp32":
        return optim.build_optimizer(cfg.optimizer, params)
    wrapper = optim.MemoryEfficientFP16Optimizer if precision.startswith("memory") else optim.FP16Optimizer
    return wrapper.build_optimizer(cfg, params)


def _per_parameter(optimizer, params, read):
    """``read(t)`` of the tensor ``optimizer`` updates for each of ``params``: FP16Optimizer's float32 master (a slice
    of ``read`` of its flat buffer, or its per-parameter copy), else the parameter itself; None where ``read`` gives
    None."""
    fp32_params = getattr(optimizer, "fp32_params", None)
    if fp32_params is None:
        return [read(p) for p in params]
    if not optimizer.has_flat_params:
        copies = dict(zip(map(id, optimizer.fp16_params), optimizer.fp32_params))
        return [read(copies[id(p)]) for p in params]
    (flat,) = fp32_params.values()
    whole = read(flat)
    offsets, offset = {}, 0
    for p in optimizer.fp16_params:
        offsets[id(p)] = offset
        offset += p.numel()
    return [None if whole is None else whole[offsets[id(p)]:offsets[id(p)] + p.numel()] for p in params]


def optimizer_masters(optimizer, params):
    """The tensors ``optimizer`` updates for ``params``: FP16Optimizer's float32 masters (slices of its flat
    buffer, or its per-parameter copies), else the parameters themselves."""
    return _per_parameter(optimizer, params, lambda t: t.detach())


def optimizer_gradients(optimizer, params):
    """The gradients ``optimizer`` applied to ``params`` at its last step, in float32: those of FP16Optimizer's
    float32 masters (unscaled and normalised there), else the parameters' own (MemoryEfficientFP16Optimizer unscales
    them in place); None for a parameter without one."""
    grads = _per_parameter(optimizer, params, lambda t: None if t.grad is None else t.grad.detach())
    return [None if g is None else g.float().view_as(p) for g, p in zip(grads, params)]


def largest_tensor_created(fn):
    """``fn()``'s result and the number of elements of the largest tensor any torch operation created while it ran
    (a memory measure that does not depend on the allocator: no intermediate is larger than this)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    with Largest():
        result = fn()
    return result, Largest.numel


def torchrun(program: str, processes: int = 2) -> list:
    """The command that runs ``program`` (a console script's name, or a script's path) in ``processes`` processes
    through torchrun: ``--standalone``, whose rendezvous store binds a free port itself (a port picked first and
    bound later can be taken in between by the connections of tests running side by side)."""
    if os.sep not in program:
        program = shutil.which(program) or os.path.join(os.path.dirname(sys.executable), program)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes), program]


#: the tests' smaller sizes, added to the catalogue's flags (--pe-relative-max-distance 16: the tests' sentences)
TEST_SIZES = {name: ["--pe-relative-max-distance", "16"] for name in ("rpe-learned", "rpe-sinusoidal")}
#: every encoding, by its name in the catalogue (fairseq_pe/systems.py, group "encodings"): its model flags
ALL_ENCODINGS = {name: flags + TEST_SIZES.get(name, []) for name, flags in catalogue.group("encodings").items()}
#: the encodings the tests train with randomised positions (--pe-random-positions: not FLOATER, and not the none
#: control): the catalogue's group "randomised"
RANDOMISABLE = list(catalogue.GROUPS["randomised"])
assert all(catalogue.get(name).randomisable for name in RANDOMISABLE)


def counting_lm_data(root) -> str:
    """Lines of counting sequences over 30 words (60 train, 10 valid, 10 test; the test split 65 tokens), binarised
    for --task language_modeling under ``root/bin``."""
    words = [f"w{i}" for i in range(30)]
    for split, n in (("train", 60), ("valid", 10), ("test", 10)):
        lines = [" ".join(words[(7 * i + k) % 30] for k in range(3 + (5 * i) % 10)) for i in range(n)]
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    cli("fairseq-preprocess", "--only-source", "--trainpref", root / "train.txt", "--validpref", root / "valid.txt",
        "--testpref", root / "test.txt", "--destdir", root / "bin", "--workers", "1")
    return root / "bin"


def forked_run(cmd, stdout=None, stderr=None, text=None) -> subprocess.CompletedProcess:
    """``subprocess.run`` of a console script (its output and errors in one stream), forked from the tests' server:
    by its name, which :func:`cli` finds on PATH (a path to the script would start a new interpreter)."""
    proc = cli(os.path.basename(cmd[0]), *cmd[1:], check=False)
    return subprocess.CompletedProcess(cmd, proc.returncode, proc.stdout + proc.stderr)


def dry_run(recipe: str, tmp_path, **env):
    """``bash RECIPE TMP/work`` with DRY_RUN=1 and this interpreter as PYTHON (and ``env``), in ``tmp_path``: the
    process and the commands it printed (its ``+ `` lines), each split as the shell would."""
    proc = subprocess.run(["bash", recipe, str(tmp_path / "work")], env=dict(os.environ, DRY_RUN="1",
                                                                              PYTHON=sys.executable, **env),
                          capture_output=True, text=True, cwd=tmp_path)
    return proc, [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]
