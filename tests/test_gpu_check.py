"""scripts/gpu_check.py, the GPU acceptance check, run on the CPU (``--device cpu``: float32 and bf16) as CI can:
every system trains, its forwards and step-by-step decoding agree with float32's, the kernel table and the all −inf
rows are reported, the JSON is written and never replaced without --force; without CUDA and without --device cpu it
says so in one line and exits 0."""

import importlib.util
import json
import os
import sys

from helpers import REPO, cli

SCRIPT = os.path.join(REPO, "scripts", "gpu_check.py")


def load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_says_so_and_exits_0():
    proc = cli(sys.executable, SCRIPT)
    assert proc.stdout.strip().splitlines() == [
        "gpu_check: no CUDA device is visible (torch.cuda.is_available() is False); nothing checked "
        "(--device cpu runs the checks on the CPU)"]


def test_every_check_on_the_cpu(tmp_path):
    gpu_check = load()
    out = tmp_path / "check"
    proc = cli(sys.executable, SCRIPT, "--device", "cpu", "--out", str(out))
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["device"] == "cpu" and result["failed"] == []
    assert set(result["systems"]) == set(gpu_check.SYSTEMS)
    assert {"floater", "floater-bias", "floater-input", "kerple-power", "rope-random"} <= set(result["systems"])
    for name, r in result["systems"].items():
        runs = r["training"]
        assert set(runs) == {"float32", "bf16"}, name
        assert all(len(run["losses"]) == 4 and run["ok"] for run in runs.values()), (name, runs)
        assert runs["bf16"]["max_relative_deviation"] <= gpu_check.TRAINING_TOLERANCE["bf16"]
        for check in ("forward", "incremental"):
            assert set(r[check]) == {"float32", "bfloat16"} and all(v["ok"] for v in r[check].values()), (name, r)
        assert r["forward"]["float32"]["max_abs_diff"] < 1e-4  # the same computation, the same device
        kernels = r["kernels"]
        assert set(kernels) == {"dtype", "padded-train", "padded-eval", "unpadded-train", "unpadded-eval"}
        for setting in ("padded-train", "padded-eval"):
            assert set(kernels[setting]) == {"encoder-self", "decoder-self", "cross"}, (name, setting)
    # the encodings with a learned bias go blockwise in training (torch's fused kernel gives no mask gradient on
    # CPU), the query-dependent vectors (Shaw) always; the others reach the fused kernel
    kernels = {name: r["kernels"] for name, r in result["systems"].items()}
    assert kernels["t5"]["padded-train"]["encoder-self"] == ["blockwise"]
    assert kernels["t5"]["padded-eval"]["encoder-self"] == ["fused:FLASH_ATTENTION"]
    assert kernels["rpe-learned"]["padded-eval"]["encoder-self"] == ["blockwise"]
    assert kernels["rope"]["padded-train"]["encoder-self"] == ["fused:FLASH_ATTENTION"]
    assert result["stock_training"]["float32"]["ok"] and result["stock_training"]["bf16"]["ok"]
    assert result["all_inf_rows"]["MATH/float32"] == "0"
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("| system | train bf16 | fwd float32 | fwd bfloat16 |")
    assert sum(line.startswith("| ") for line in lines) == 2 + len(gpu_check.SYSTEMS)
    assert "0 of 20 systems failed a check" in proc.stdout
    again = cli(sys.executable, SCRIPT, "--device", "cpu", "--out", str(out), check=False)
    assert again.returncode == 2 and "--force" in again.stderr.strip().splitlines()[-1]


def test_a_failed_measure_is_shown_with_its_value():
    gpu_check = load()
    assert gpu_check.cell({"float16": {"max_abs_diff": 0.31, "tolerance": 0.05, "ok": False}}, "float16") == "✗ 0.31"
    assert gpu_check.cell({"bf16": {"ok": False, "problems": ["3 of 4 updates"]}}, "bf16") == "✗ 3 of 4 updates"
    assert gpu_check.cell({"bf16": {"ok": True}}, "bf16") == "ok"
    assert gpu_check.kernel_codes({"encoder-self": ["fused:FLASH_ATTENTION"], "decoder-self": ["blockwise"],
                                   "cross": ["fairseq", "fused:EFFICIENT_ATTENTION"]}) == "F/B/f+E"
