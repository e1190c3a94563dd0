"""The benchmark scripts run end to end (tiny settings; they measure, they do not assert speed)."""

import json
import os
import subprocess
import sys

from helpers import REPO, load_script

BENCHMARK = os.path.join(REPO, "scripts", "benchmark_positions.py")


def cells(md, system):
    """The cells of a system's row of the Markdown table."""
    rows = [line for line in md.splitlines() if line.startswith(f"| {system} |")]
    assert len(rows) == 1, md
    return [c.strip() for c in rows[0].strip("|").split("|")]


def test_benchmark_script_smoke(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, BENCHMARK, "--out", str(out), "--size", "tiny",
           "--systems", "rpe-learned", "--updates", "2", "--max-tokens", "500",
           "--sentences", "40", "--gen-sentences", "3", "--gen-len", "5", "--vocab", "50", "--lengths", "64",
           "--threads", "1", "--repeats", "2"]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((out / "benchmark.json").read_text())
    res = data["results"]
    # stock fairseq is the baseline, measured first; then the systems asked for
    assert list(res) == ["stock", "rpe-learned"]
    assert data["baseline"] == "stock" and data["settings"]["stock_arch"] == "transformer"
    assert data["settings"]["arch"] == "transformer_pe_tiny"
    for name, r in res.items():
        assert r["train_s"] >= 0 and r["generate_s"] > 0 and r["train_peak_kb"] > 0
        assert len(r["rounds"]) == 2 and r["train_s"] == min(x["train_s"] for x in r["rounds"])
        assert r["generate_s"] == min(x["generate_s"] for x in r["rounds"])
        assert set(r["encoder_forward_extra_kb"]) == {"64"}
        # the same model size, the same shared vocabulary and no dropout for everyone
        assert r["sizes"] == res["stock"]["sizes"]
        assert r["sizes"]["encoder_layers"] == 2 and r["sizes"]["encoder_embed_dim"] == 64
        train, generate = r["commands"]["train"], r["commands"]["generate"]
        for flag in ("--share-all-embeddings", "--dropout", "--attention-dropout", "--activation-dropout"):
            assert flag in train
        plugin = name != "stock"
        # stock fairseq runs without the plugin; every other system with it
        assert ("--user-dir" in train) == plugin and ("--user-dir" in generate) == plugin
        assert r["commands"]["encoder"][0] == ("plugin" if plugin else "stock")
    assert res["stock"]["commands"]["train"][res["stock"]["commands"]["train"].index("--arch") + 1] == "transformer"
    assert "--pe-absolute" not in res["stock"]["commands"]["train"]
    assert res["rpe-learned"]["flags"] == "--pe-absolute none --pe-relative learned"

    md = (out / "benchmark.md").read_text()
    head = cells(md, "system")
    assert head[:5] == ["system", "train time", "train peak mem", "generation time", "enc. mem T=64"]
    stock = res["stock"]
    figures = [stock["train_s"], stock["train_peak_kb"], stock["generate_s"], stock["encoder_forward_extra_kb"]["64"]]
    assert cells(md, "stock")[1:5] == ["1.00×" if f > 0 else "n/a" for f in figures]
    assert stock["train_peak_kb"] > 0 and stock["generate_s"] > 0
    # the ratios are the JSON's numbers divided by stock's, with the target of the system's group
    # (a stock figure of 0, e.g. "done training in 0.0 seconds" on a fast machine, gives "n/a")
    def ratio(system, value):
        base = value(res["stock"])
        return None if base <= 0 else value(res[system]) / base

    row = cells(md, "rpe-learned")
    train_ratio = ratio("rpe-learned", lambda r: r["train_s"])
    target = res["rpe-learned"]["targets"]["train_s"]
    assert target["target"] == 1.20
    if train_ratio is None:
        assert row[1] == "n/a" and target["met"] is None
    else:
        assert row[1].startswith(f"{train_ratio:.2f}×")
        assert target["met"] == (round(train_ratio, 2) <= 1.20)
        assert row[1] == f"{train_ratio:.2f}× " + ("✓" if target["met"] else "✗ (≤1.20)")
    gen_ratio = ratio("rpe-learned", lambda r: r["generate_s"])
    assert row[3].startswith(f"{gen_ratio:.2f}×")
    enc_ratio = ratio("rpe-learned", lambda r: r["encoder_forward_extra_kb"]["64"])
    assert row[4] == ("n/a" if enc_ratio is None else f"{enc_ratio:.2f}×")  # no target at T=64
    assert res["rpe-learned"]["target_group"] == "Shaw, NEZHA, learnable-sin RPE"
    # stock's absolute figures, the summary line (also on stdout), the targets table
    assert f"train {res['stock']['train_s']:.1f} s" in md
    assert data["summary"]["line"] in md and data["summary"]["line"] in proc.stdout
    assert data["summary"]["line"].startswith("targets: ")
    assert "| Shaw, NEZHA, learnable-sin RPE | rpe-* | ≤1.20 | ≤2.00 | ≤1.10 |" in md
    assert (out / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # progress: one line per measurement, with the round and what is left
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[benchmark ")]
    assert any("round 2/2, stock: train" in line and "left" in line for line in progress)
    assert sum("encoder forward T=64" in line for line in progress) == 2

    # a second run into the same --out needs --force
    again = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert again.returncode == 2, again.stderr[-3000:]
    assert "--force" in again.stderr and "benchmark.md" in again.stderr
    assert json.loads((out / "benchmark.json").read_text()) == data  # untouched


def test_analysis_benchmark_script_smoke(tmp_path):
    out = tmp_path / "bench-analysis"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "benchmark_analysis.py"), "--out", str(out),
         "--arch", "roberta_pe_tiny", "--systems", "floater", "--vocab", "60", "--repeats", "2",
         "--analyze-args", "--length", "16", "--probe-length", "16"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((out / "benchmark.json").read_text())["results"]
    assert list(res) == ["ape-sinusoidal", "floater"]
    for r in res.values():
        assert len(r["seconds_rounds"]) == 2 and r["seconds"] == min(r["seconds_rounds"]) > 0
    assert res["ape-sinusoidal"]["ratio"] == 1.0
    lines = (out / "benchmark.md").read_text().splitlines()
    assert "| ape-sinusoidal |" in lines[4] and lines[4].endswith("| 1.00× |") and lines[5].startswith("| floater |")
    # the analysed checkpoints' reports are there, with the options passed on
    assert json.loads((out / "analysis" / "floater" / "scores.json").read_text())["length"] == 16


def test_benchmark_script_encoder_memory_only_with_a_left_padded_batch(tmp_path):
    """--encoder-only measures the encoder forward memory alone; --encoder-batch left-padded adds a half-length
    sentence padded on the left (FIRE's per-row path under randomised positions)."""
    out = tmp_path / "bench"
    cmd = [sys.executable, BENCHMARK, "--out", str(out), "--size", "tiny", "--systems", "fire-random",
           "--encoder-only", "--encoder-batch", "left-padded", "--vocab", "50", "--lengths", "64", "--threads", "1",
           "--bf16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((out / "benchmark.json").read_text())
    res = data["results"]
    assert list(res) == ["stock", "fire-random"] and data["settings"]["encoder_batch"] == "left-padded"
    assert res["fire-random"]["flags"] == "--pe-absolute none --pe-relative fire --pe-random-positions 72"
    for r in res.values():
        assert r["rounds"] == [] and r["train_s"] is None and r["encoder_forward_extra_kb"]["64"] > 0
        assert "left-padded" in r["commands"]["encoder"]
    md = (out / "benchmark.md").read_text()
    assert cells(md, "fire-random")[1:4] == ["n/a", "n/a", "n/a"] and cells(md, "fire-random")[4].endswith("×")
    assert "T and T/2 tokens, padded on the left" in md and "training:" not in md
    assert "CPU, bfloat16" in md and res["stock"]["commands"]["encoder"][7:9] == ["cpu", "bfloat16"]


def test_benchmark_commands_on_cuda_with_half_precision(monkeypatch):
    """--device cuda: fairseq's commands lose --cpu and take --fp16 (or --bf16); the encoder forward runs on
    CUDA in that dtype; a machine without CUDA, or --fp16 on the CPU, is told so (exit 2, the flag named)."""
    import torch

    bench = load_script("benchmark_positions")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA Test GPU")
    args = bench.parse_args(["--device", "cuda", "--fp16", "--size", "tiny"])
    cmds = bench.commands(args, "rope", "DATA", "SAVE")
    for kind in ("train", "generate"):
        assert "--cpu" not in cmds[kind] and cmds[kind].count("--fp16") == 1 and "--bf16" not in cmds[kind]
    assert cmds["encoder"][7:9] == ["cuda", "float16"]
    assert bench.precision_label(args) == "CUDA (NVIDIA Test GPU), float16"
    stock = bench.commands(bench.parse_args(["--device", "cuda", "--bf16", "--size", "tiny"]), "stock", "DATA", "SAVE")
    assert "--bf16" in stock["train"] and "--user-dir" not in stock["train"]
    assert "--cpu" in bench.commands(bench.parse_args(["--size", "tiny"]), "rope", "DATA", "SAVE")["train"]
    env = dict(os.environ, PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")
    for flags, named in ((["--fp16"], "--fp16 needs --device cuda"), (["--device", "cuda"], "--device cuda:")):
        proc = subprocess.run([sys.executable, BENCHMARK, "--out", "unused", *flags], capture_output=True, text=True,
                              env=env)
        assert proc.returncode == 2 and named in proc.stderr, proc.stderr[-2000:]
