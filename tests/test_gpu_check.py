"""fairseq-pe-gpu-check (fairseq_pe/benchmark/gpu_check/) and scripts/gpu_session.sh, the GPU machine's one command,
rehearsed on the CPU as CI can:

* the rehearsal (``bash scripts/gpu_session.sh OUT --device cpu``, within :data:`REHEARSAL_BUDGET` seconds) runs
  every check type, each asserting something (the kernel table of docs/speed.md, rows of −inf giving 0, two gloo
  ranks, every update), writes the JSON and the Markdown table, and exits 0;
* a fault injected into one encoding on the checked path (ALiBi's bias dropped from the decoder's fused
  self-attention) makes the kernel and decoding checks fail, naming ``alibi``, and the run exit 1;
* trainings get a world size of 1 when torch reports two GPUs (fairseq's default is the GPU count), and fairseq's
  ``call_main`` then trains in this process instead of spawning a worker per GPU;
* an exception in one check is that check's failure, the others go on; a budget spent leaves checks "not run", and
  the JSON written so far;
* without CUDA and without --device cpu it says so in one line and exits 0; the console script runs a check on the
  CPU."""

import json
import os
import subprocess
import sys
import time

from fairseq_pe.benchmark.gpu_check import cli as gpu_check
from fairseq_pe.benchmark.gpu_check import context, kernels, registry, training
from fairseq_pe.benchmark.gpu_check import ddp as ddp_check

from helpers import REPO, cli

SESSION = os.path.join(REPO, "scripts", "gpu_session.sh")
#: the CPU rehearsal's budget: the checks get --budget REHEARSAL_CHECKS, the whole command must end within
#: REHEARSAL_BUDGET seconds (measured on 2 cores: 44 s idle, 118 s under a load average of 8; docs/install.md)
REHEARSAL_CHECKS = 240
REHEARSAL_BUDGET = 300


def test_without_cuda_it_says_so_and_exits_0_and_it_checks_on_the_cpu(tmp_path):
    """The console script (tests/fresh_subset.py runs it as a new interpreter, through its installed wrapper)."""
    proc = cli("fairseq-pe-gpu-check")
    assert proc.stdout.strip().splitlines() == [
        "fairseq-pe-gpu-check: no CUDA device is visible (torch.cuda.is_available() is False); nothing checked "
        "(--device cpu runs the checks on the CPU)"]
    proc = cli("fairseq-pe-gpu-check", "--device", "cpu", "--systems", "alibi", "--checks", "forward", "--out",
               tmp_path / "cpu")
    result = json.loads((tmp_path / "cpu" / "gpu_check.json").read_text())
    assert result["failed"] == [] and result["checks"]["forward"]["systems"]["alibi"]["status"] == "ok"
    assert "| alibi | ok |" in proc.stdout and "0 failed, 0 not run (budget), 1 passed" in proc.stdout


def test_the_cpu_rehearsal_of_the_one_command(tmp_path, monkeypatch):
    out = tmp_path / "session"
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    started = time.monotonic()
    proc = subprocess.run(["bash", SESSION, str(out), "--device", "cpu", "--budget", str(REHEARSAL_CHECKS)],
                          capture_output=True, text=True, env=env, timeout=REHEARSAL_BUDGET + 60)
    wall = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert wall < REHEARSAL_BUDGET, f"the rehearsal took {wall:.0f} s, its budget is {REHEARSAL_BUDGET} s"
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["failed"] == [] and result["not_run"] == [], (result["failed"], result["not_run"])
    assert list(result["checks"]) == [c.name for c in registry.CHECKS]  # every check type, in order
    systems = context.REHEARSAL_SYSTEMS
    checks = {name: entry["systems"] for name, entry in result["checks"].items()}
    for name in ("kernels", "forward", "incremental", "masked-rows", "positions"):
        assert list(checks[name]) == systems, name
    assert list(checks["training"]) == ["stock", "ape-sinusoidal"] and list(checks["ddp"]) == ["t5"]
    assert all(one["status"] == "ok" for entry in checks.values() for one in entry.values())
    # kernels: the CPU table of docs/speed.md, the fused calls on torch's fused CPU kernel
    kernels = checks["kernels"]
    assert kernels["t5"]["details"]["float32/padded-train"]["arguments"] == \
        "blockwise / blockwise / mask B11S + fairseq"
    assert kernels["ape-sinusoidal"]["details"]["float32/unpadded-train"] == {
        "arguments": "none / causal / none + fairseq",
        "kernels": ["causal: FLASH_ATTENTION", "none: FLASH_ATTENTION"]}
    # rows whose every key is masked: through the fused kernel, and the blockwise and explicit paths
    masked = checks["masked-rows"]
    assert masked["ape-sinusoidal"]["details"]["float32, torch's choice"] == ["fused:FLASH_ATTENTION"]
    # (a decoding step of a bias is one SDPA call with the step's row of the mask, no longer the explicit path)
    assert masked["t5"]["details"]["float32, torch's choice"] == ["blockwise", "fused:FLASH_ATTENTION"]
    # positions: fp16 and bf16 against float32 within the probe's tolerances, on a batch where positions matter
    for system in systems:
        for precision, row in checks["positions"][system]["details"].items():
            assert row["logprob_deviation"] <= row["tolerance"]["logprob"] < row["logprob_effect_removed"], \
                (system, precision, row)
    # trainings: every update in this process; ddp: two gloo ranks per backend, every update, agreeing losses
    for system in ("stock", "ape-sinusoidal"):
        assert len(checks["training"][system]["details"]["bf16"]["losses"]) == 4
    ddp = checks["ddp"]["t5"]["details"]
    assert ddp["setting"] == "2 processes on the CPU over gloo"
    for backend in ("c10d", "legacy_ddp"):
        assert ddp[backend]["ranks_started"] == 2 and len(ddp[backend]["losses"]) == 4
    assert ddp["max_relative_deviation"] <= ddp_check.DDP_TOLERANCE["float32"]
    # flex: FlexAttention's eager forward (the bias as a score_mod, a block mask) equals the dense SDPA path
    flex = checks["flex"]["alibi"]["details"]
    assert list(checks["flex"]) == ["alibi"] and flex["output_error"] <= flex["tolerance"]["output"]
    table = (out / "gpu_check.md").read_text()
    assert "| system | kernels | masked-rows | forward | incremental | positions | ddp | training | flex |" in table
    assert "| alibi | ok | ok | ok | ok | ok | – | – | ok |" in table
    assert "0 failed, 0 not run (budget), 19 passed" in table
    assert table in proc.stdout  # the summary printed at the end
    session = (out / "session.txt").read_text()
    assert "install: not needed" in session and "benchmark: CUDA only" in session
    # the benchmark's command line, as the session would run it on CUDA, is one fairseq-pe-benchmark takes
    benchmark = session.split("benchmark: CUDA only (on the GPU machine: ", 1)[1].split(")\n", 1)[0].split()
    assert benchmark[0] == "fairseq-pe-benchmark"
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # its parser asks for a GPU
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a stand-in GPU")
    from fairseq_pe.benchmark.cli import parse_args

    parsed = parse_args(benchmark[1:])
    assert parsed.device == "cuda" and parsed.fp16 and parsed.systems == ["ape-sinusoidal", "rope", "t5",
                                                                          "rpe-learned"]
    again = subprocess.run(["bash", SESSION, str(out), "--device", "cpu"], capture_output=True, text=True, env=env)
    assert again.returncode == 2 and "--force" in again.stderr


def test_an_injected_fault_fails_the_check_and_names_the_encoding(tmp_path, monkeypatch):
    """ALiBi's bias dropped where the decoder's self-attention goes fused (its ``adds_bias`` says no: the attention
    then passes is_causal alone, as for an encoding without a bias): the kernel check sees the arguments change, the
    decoding check sees the full pass differ from step-by-step decoding (which adds the bias), both name alibi; the
    sinusoidal APE in the same run passes.  Without the fault the same run passes."""
    from fairseq_pe.positional.alibi import ALiBiPositionBias

    argv = ["--device", "cpu", "--systems", "ape-sinusoidal", "alibi", "--checks", "kernels", "incremental"]
    assert gpu_check.main([*argv, "--out", str(tmp_path / "sound")]) == 0
    monkeypatch.setattr(ALiBiPositionBias, "adds_bias", property(lambda self: False))
    assert gpu_check.main([*argv, "--out", str(tmp_path / "fault")]) == 1
    result = json.loads((tmp_path / "fault" / "gpu_check.json").read_text())
    assert result["failed"] == ["kernels alibi", "incremental alibi"]
    kernels = result["checks"]["kernels"]["systems"]["alibi"]["problems"]
    assert "unpadded-train: the attentions hand SDPA 'mask 1HTS / causal / none + fairseq', docs/speed.md's " \
           "table says 'mask 1HTS / mask 1HTS / none + fairseq'" in kernels
    assert result["checks"]["incremental"]["systems"]["alibi"]["problems"][0].startswith(
        "float32 unpadded: step-by-step decoding ")  # 0.316 from the full pass (tolerance 0.0001)
    table = (tmp_path / "fault" / "gpu_check.md").read_text()
    assert "| alibi | ✗ unpadded-train: the attentions hand SDPA 'mask 1HTS / causal… | ✗ float32 unpadded: " \
           "step-by-step decoding" in table
    assert "- kernels alibi: unpadded-train:" in table and "| ape-sinusoidal | ok | ok |" in table
    assert "2 failed, 0 not run (budget), 2 passed" in table


def test_a_half_precision_model_without_its_bias_fails_the_positions_check(tmp_path, monkeypatch):
    """The positions check (fairseq_pe.diagnostics.precision through gpu_check): ALiBi's positions switched off in
    the fp16/bf16 model only (the probe's own fault hook, entered around the half-precision passes) fail it for both
    precisions, naming alibi; the sinusoidal APE in the same run passes, and without the fault alibi passes."""
    import functools

    from fairseq_pe.diagnostics import precision as precision_probe

    argv = ["--device", "cpu", "--systems", "ape-sinusoidal", "alibi", "--checks", "positions"]
    assert gpu_check.main([*argv, "--out", str(tmp_path / "sound")]) == 0
    original = precision_probe.compare_precisions

    def faulty(model, sample, *args, **kwargs):
        alibi = "alibi" in precision_probe.describe_positions(model)
        return original(model, sample, *args, fault=precision_probe.positions_removed if alibi else None, **kwargs)

    monkeypatch.setattr(precision_probe, "compare_precisions", functools.wraps(original)(faulty))
    assert gpu_check.main([*argv, "--out", str(tmp_path / "fault")]) == 1
    result = json.loads((tmp_path / "fault" / "gpu_check.json").read_text())
    assert result["failed"] == ["positions alibi"]
    problems = result["checks"]["positions"]["systems"]["alibi"]["problems"]
    for precision in ("fp16", "bf16"):
        assert any(p.startswith(f"{precision} relative alibi: log-probs deviate from float32") for p in problems), \
            problems


def test_trainings_get_a_world_size_of_1_when_torch_reports_two_gpus(monkeypatch, tmp_path):
    """fairseq's --distributed-world-size defaults to the GPU count (read when fairseq is imported; set here as on a
    machine with two GPUs): call_main would spawn a worker per GPU, whose log lines never reach the check."""
    import torch
    from fairseq import options
    from fairseq.distributed import utils as distributed_utils

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    training_parser = options.get_training_parser

    def as_with_two_gpus(*a, **kw):
        parser = training_parser(*a, **kw)
        parser.set_defaults(distributed_world_size=2)
        return parser

    monkeypatch.setattr(options, "get_training_parser", as_with_two_gpus)
    spawned, ran = [], []
    monkeypatch.setattr(torch.multiprocessing, "spawn", lambda **kw: spawned.append(kw["nprocs"]))
    args = gpu_check.parse_args(["--device", "cuda"])
    argv = training.training_argv(args, str(tmp_path), "alibi", "fp16", str(tmp_path / "save"))
    cfg = training.training_config(argv)
    assert cfg.distributed_training.distributed_world_size == 1
    distributed_utils.call_main(cfg, lambda cfg, **kw: ran.append(cfg.distributed_training.distributed_world_size))
    assert ran == [1] and spawned == []
    # the same command line without --distributed-world-size 1: fairseq's default, and a worker per GPU
    i = argv.index("--distributed-world-size")
    default = training.training_config(argv[:i] + argv[i + 2:])
    assert default.distributed_training.distributed_world_size == 2
    distributed_utils.call_main(default, lambda cfg, **kw: ran.append("in this process"))
    assert spawned == [2] and ran == [1]


def test_an_exception_is_that_checks_failure_and_the_budget_leaves_checks_not_run(tmp_path, monkeypatch):
    def broken(ctx, system):
        if system == "alibi":
            raise ValueError("something broke")
        return {"fine": True}

    def slow(ctx, system):
        time.sleep(30)

    checks = [registry.Check("broken", "raises for alibi", broken, lambda ctx: ctx.systems(),
                             {"cuda": 0, "cpu": 0}),
              registry.Check("slow", "outlasts the budget", slow, lambda ctx: ctx.systems(), {"cuda": 0, "cpu": 0.5})]
    monkeypatch.setattr(registry, "CHECKS", checks)
    started = time.monotonic()
    status = gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--systems", "alibi", "rope", "--budget",
                             "2", "--checks", "broken", "slow"])
    assert status == 1 and time.monotonic() - started < 20
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["failed"] == ["broken alibi"]
    broken_alibi = result["checks"]["broken"]["systems"]["alibi"]
    assert broken_alibi["problems"] == ["ValueError: something broke"] and "Traceback" in broken_alibi["traceback"]
    assert result["checks"]["broken"]["systems"]["rope"]["status"] == "ok"  # the others go on
    slow_runs = result["checks"]["slow"]["systems"]
    assert slow_runs["alibi"] == {**slow_runs["alibi"], "status": "not run",
                                  "problems": ["stopped at the end of the budget"]}
    assert slow_runs["rope"]["status"] == "not run" and slow_runs["rope"]["problems"][0].startswith("budget: 0 s left")
    assert "1 failed, 2 not run (budget), 1 passed" in (tmp_path / "gpu_check.md").read_text()


def test_the_allowed_kernels():
    assert kernels.allowed_backends("causal", cuda=True) == {"FLASH_ATTENTION", "CUDNN_ATTENTION"}
    assert kernels.allowed_backends("mask 1HTS ∇", cuda=True) == {"EFFICIENT_ATTENTION"}
    assert kernels.allowed_backends("mask B11S", cuda=True) == {"EFFICIENT_ATTENTION", "CUDNN_ATTENTION"}
    assert kernels.allowed_backends("mask BHTS", cuda=False) == {"FLASH_ATTENTION"}
    # every system of the run has a row in docs/speed.md's tables, which the kernel check asserts
    for cuda in (False, True):
        assert sorted(kernels.expected_arguments(cuda)) == sorted(context.SYSTEMS)


def test_a_softmax_that_gives_nan_for_a_masked_row_fails_the_masked_rows_check(tmp_path, monkeypatch):
    """The masked-rows check looks at what the attention returns: with fairseq's plain softmax in the plugin's
    blockwise and explicit paths (NaN for a row of −inf) it fails, naming t5 and the path."""
    import torch

    import fairseq_pe.models.attention as attention

    monkeypatch.setattr(attention, "safe_softmax", lambda logits: torch.softmax(logits.float(), dim=-1))
    argv = ["--device", "cpu", "--systems", "t5", "--checks", "masked-rows", "--out", str(tmp_path)]
    assert gpu_check.main(argv) == 1
    problems = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]["masked-rows"]["systems"]["t5"]
    assert "float32, torch's choice, train, empty source encoder-self (blockwise): non-finite output" in \
        problems["problems"]


def test_the_session_without_fairseq_names_the_wheelhouse_to_build(tmp_path):
    """A Python where fairseq does not import (a stand-in that fails every command) and no folder of wheels: the
    session stops with status 1 and the command that builds the folder; --no-install says it cannot go on."""
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    env = dict(os.environ, PYTHON=str(python))
    proc = subprocess.run(["bash", SESSION, str(tmp_path / "out"), "--wheelhouse-missing"], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 2 and "unknown option '--wheelhouse-missing'" in proc.stderr
    if not os.path.exists(os.path.join(REPO, "wheelhouse")):  # (a checkout may have built one)
        proc = subprocess.run(["bash", SESSION, str(tmp_path / "out")], capture_output=True, text=True, env=env)
        assert proc.returncode == 1
        assert "there is no folder of wheels 'wheelhouse': build it where PyPI is reachable (python " \
               "scripts/build_wheelhouse.py --python-version 3.12 --have scripts/wheelhouse/gpu-machine-have.txt " \
               "--out wheelhouse) and bring it along" in proc.stderr
    proc = subprocess.run(["bash", SESSION, str(tmp_path / "out2"), "--no-install"], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 1 and "--no-install, and fairseq_pe does not import" in proc.stderr


def test_a_failed_ddp_run_names_the_ranks_exception_not_torchruns_summary():
    """torchrun prints its own summary (``ChildFailedError``, ``error_file: <N/A>``) after the ranks' tracebacks: the
    check's failure names the first exception a rank raised (one CPU rehearsal said only ``error_file: <N/A>``)."""
    text = "\n".join([
        "2026-11-28 15:57:00 | INFO | fairseq.distributed.utils | distributed init (rank 0): env://",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "fairseq/distributed/utils.py", line 258, in distributed_init',
        "[rank1]: torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
        "address. port: 41234, useIPv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
        "Traceback (most recent call last):",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "Root Cause (first observed failure):",
        "  exitcode  : 1 (pid: 123)",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    ])
    line = ddp_check.last_error_line(text)
    assert line.startswith("[rank1]: torch.distributed.DistNetworkError: The server socket") and "EADDRINUSE" in line
    assert ddp_check.last_error_line("ValueError: --pe-x 3: bad\nmore") == "ValueError: --pe-x 3: bad"
    assert ddp_check.last_error_line("a runtime error happened\nerror_file: <N/A>") == "a runtime error happened"
    assert ddp_check.last_error_line("killed") == "killed"
