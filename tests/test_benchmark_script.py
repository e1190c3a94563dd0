"""The benchmarks run end to end (fairseq-pe-benchmark, fairseq_pe/benchmark/; scripts/benchmark_analysis.py): tiny
settings, they measure, they do not assert speed."""

import json
import os
import subprocess
import sys

from fairseq_pe.benchmark import cli as benchmark
from fairseq_pe.benchmark import language_model, long_context, models, translation
from fairseq_pe.benchmark.runner import MeasurementFailed, Progress

from helpers import REPO, cli

BENCHMARK = "fairseq-pe-benchmark"


def cells(md, system):
    """The cells of a system's row of the Markdown table."""
    rows = [line for line in md.splitlines() if line.startswith(f"| {system} |")]
    assert len(rows) == 1, md
    return [c.strip() for c in rows[0].strip("|").split("|")]


def test_benchmark_script_smoke(tmp_path):
    out = tmp_path / "bench"
    cmd = [BENCHMARK, "--out", str(out), "--size", "tiny",
           "--systems", "rpe-learned", "--updates", "2", "--max-tokens", "500",
           "--sentences", "40", "--gen-sentences", "3", "--gen-len", "5", "--vocab", "50", "--lengths", "64",
           "--threads", "1", "--repeats", "2"]
    proc = cli(*cmd, check=False)  # the script from the tests' fork server; its measurements in fresh processes
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
    again = cli(*cmd, check=False)
    assert again.returncode == 2, again.stderr[-3000:]
    assert "--force" in again.stderr and "benchmark.md" in again.stderr
    assert json.loads((out / "benchmark.json").read_text()) == data  # untouched


def test_analysis_benchmark_script_smoke(tmp_path):
    out = tmp_path / "bench-analysis"
    proc = cli(sys.executable, os.path.join(REPO, "scripts", "benchmark_analysis.py"), "--out", str(out),
               "--arch", "roberta_pe_tiny", "--systems", "floater", "--vocab", "60", "--repeats", "2",
               "--analyze-args", "--length", "16", "--probe-length", "16", check=False)
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
    cmd = [BENCHMARK, "--out", str(out), "--size", "tiny", "--systems", "fire-random",
           "--encoder-only", "--encoder-batch", "left-padded", "--vocab", "50", "--lengths", "64", "--threads", "1",
           "--bf16"]
    proc = cli(*cmd, check=False)
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

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA Test GPU")
    args = benchmark.parse_args(["--device", "cuda", "--fp16", "--size", "tiny"])
    cmds = translation.commands(args, "rope", "DATA", "SAVE")
    for kind in ("train", "generate"):
        assert "--cpu" not in cmds[kind] and cmds[kind].count("--fp16") == 1 and "--bf16" not in cmds[kind]
    assert cmds["encoder"][7:9] == ["cuda", "float16"]
    assert models.precision_label(args) == "CUDA (NVIDIA Test GPU), float16"
    stock = translation.commands(benchmark.parse_args(["--device", "cuda", "--bf16", "--size", "tiny"]), "stock", "DATA",
                                 "SAVE")
    assert "--bf16" in stock["train"] and "--user-dir" not in stock["train"]
    assert "--cpu" in translation.commands(benchmark.parse_args(["--size", "tiny"]), "rope", "DATA", "SAVE")["train"]
    env = dict(os.environ, PYTHONWARNINGS="ignore", CUDA_VISIBLE_DEVICES="")
    for flags, named in ((["--fp16"], "--fp16 needs --device cuda"), (["--device", "cuda"], "--device cuda:")):
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), BENCHMARK), "--out", "unused", *flags],
                              capture_output=True, text=True, env=env)
        assert proc.returncode == 2 and named in proc.stderr, proc.stderr[-2000:]


def test_benchmark_long_context_evaluation(tmp_path):
    """--long: one encoder forward of one sentence in evaluation (no_grad) per system and length, in a fresh
    process; memory and time as ratios to stock at the same T, the first call apart, the per-token memory of the
    longest T against the shortest; --encoder-layers the same for stock and plugin, the kernel passed to the plugin."""
    out = tmp_path / "long"
    cmd = [BENCHMARK, "--out", str(out), "--size", "tiny", "--systems", "alibi", "--long",
           "--long-lengths", "128", "64", "--encoder-layers", "1", "--threads", "1", "--repeats", "2", "--vocab", "50"]
    proc = cli(*cmd, check=False)  # the script from the tests' fork server; its measurements in fresh processes
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not (out / "benchmark.md").exists() and (out / "benchmark-long.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads((out / "benchmark-long.json").read_text())
    res = data["results"]
    assert list(res) == ["stock", "alibi"] and data["settings"]["long_lengths"] == [64, 128]
    for name, r in res.items():
        assert r["long_errors"] == {} and set(r["long"]) == {f"eval T=64{'' if name == 'stock' else ' auto'}",
                                                             f"eval T=128{'' if name == 'stock' else ' auto'}"}
        for m in r["long"].values():
            cmd_ = m["command"]
            assert cmd_[0] == ("stock" if name == "stock" else "plugin") and cmd_[6:10] == ["1", "cpu", "float32",
                                                                                            "eval"]
            assert " --encoder-layers 1" in " ".join(cmd_)
            assert ("--pe-attention-kernel" in cmd_) == (name != "stock")
            assert len(m["times_s"]) == 2 and m["best_s"] == min(m["times_s"]) > 0 and m["first_s"] > 0
            assert m["mem_kb"] >= 0
    assert res["alibi"]["long"]["eval T=64 auto"]["command"][-2:] == ["--pe-attention-kernel", "auto"]

    def mem(name, t):
        return res[name]["long"][f"eval T={t}" + ("" if name == "stock" else " auto")]["mem_kb"]

    def ratio(a, b):
        return None if b <= 0 else a / b

    ratios = res["alibi"]["ratios"]
    for t in (64, 128):
        m = res["alibi"]["long"][f"eval T={t} auto"]
        s = res["stock"]["long"][f"eval T={t}"]
        assert ratios[f"eval_mem_{t}"] == ratio(mem("alibi", t), mem("stock", t))
        assert ratios[f"eval_s_{t}"] == m["best_s"] / s["best_s"]
        assert ratios[f"eval_first_{t}"] == m["first_s"] / s["first_s"]
    assert ratios["per_token"] == ratio(mem("alibi", 128) / 128, mem("alibi", 64) / 64)

    md = (out / "benchmark-long.md").read_text()
    memory_head = cells(md.split("Evaluation time")[0], "system")
    assert memory_head == ["system", "eval mem T=64", "eval mem T=128", "mem/token T=128 vs 64"]
    time_head = cells(md.split("Evaluation time")[1], "system")
    assert time_head == ["system", "eval time T=64", "first call T=64", "eval time T=128", "first call T=128"]
    memory_row = cells(md.split("Evaluation time")[0], "alibi")[1:]
    time_row = cells(md.split("Evaluation time")[1], "alibi")[1:]
    keys = ["eval_mem_64", "eval_mem_128", "per_token"]
    for text, key in zip(memory_row + time_row, keys + ["eval_s_64", "eval_first_64", "eval_s_128", "eval_first_128"]):
        # a number (no target at these lengths: no mark), "n/a" only where stock's figure is 0
        assert text == ("n/a" if ratios[key] is None else f"{ratios[key]:.2f}×"), (key, text)
    assert all(c.endswith("×") for c in time_row)
    assert cells(md.split("Evaluation time")[0], "stock")[1:3] == ["1.00×" if mem("stock", t) > 0 else "n/a"
                                                                    for t in (64, 128)]
    assert "1 encoder layer;" in md and "targets: none apply to these lengths" in md
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[benchmark ")]
    assert sum("evaluation encoder T=" in line for line in progress) == 4
    assert any("alibi: evaluation encoder T=128, auto" in line and "(4/4 done" in line for line in progress)


def test_benchmark_long_context_targets_and_failures():
    """The long targets (the issue's): evaluation memory at 16384 and 32768 ≤ 1.10× (FLOATER's biases ≤ 2.5×),
    time at 16384 ≤ 1.3× for the biased encodings, per-token memory at 32768 against 4096 within ±10%, CUDA training
    memory at 8192 ≤ 1.2× (judged on CUDA only); a failed measurement is "failed" and not measured."""
    args = benchmark.parse_args(["--long", "--size", "tiny"])
    assert args.long_lengths == [4096, 8192, 16384, 32768] and args.long_kernel == "auto"

    def runs(name, mem, seconds, failed=(), first=2):
        kernel = "" if name == "stock" else " auto"
        return {"flags": "", "long_errors": {f"eval T={t}{kernel}": "out of memory" for t in failed},
                "long": {f"eval T={t}{kernel}": None if t in failed else
                         {"mem_kb": mem(t), "best_s": seconds(t), "first_s": first * seconds(t)}
                         for t in args.long_lengths}}

    results = {
        "stock": runs("stock", lambda t: t, lambda t: t / 1000),
        # memory 1.05x but 1.2x at 32768 (and so 1.14x per token); time 1.25x
        "alibi": runs("alibi", lambda t: 1.2 * t if t == 32768 else 1.05 * t, lambda t: 1.25 * t / 1000),
        # time 1.4x at 16384 (a miss), its first call 7x; memory per token 0.95x (within ±10%)
        "t5": runs("t5", lambda t: 0.95 * t if t == 32768 else t, lambda t: 1.4 * t / 1000, first=10),
        "floater-bias": runs("floater-bias", lambda t: 2.4 * t, lambda t: 3 * t / 1000),
        "rope": runs("rope", lambda t: t, lambda t: t / 1000, failed=(32768,)),
    }
    long_context.long_ratios(args, results)
    assert results["alibi"]["targets"] == {
        "eval_mem_16384": {"target": 1.1, "ratio": 1.05, "met": True},
        "eval_mem_32768": {"target": 1.1, "ratio": 1.2, "met": False},
        "eval_s_16384": {"target": 1.3, "ratio": 1.25, "met": True},
        "per_token": {"target": 0.1, "ratio": 1.2 / 1.05, "met": False}}
    assert results["t5"]["targets"]["eval_s_16384"]["met"] is False
    assert results["t5"]["targets"]["per_token"]["met"] is True
    assert results["floater-bias"]["targets"]["eval_mem_32768"] == {"target": 2.5, "ratio": 2.4, "met": True}
    assert "eval_s_16384" not in results["floater-bias"]["targets"]  # no time target outside the biased group
    assert results["rope"]["targets"]["eval_mem_32768"]["met"] is None and "stock" not in [
        n for n, r in results.items() if r["targets"]]
    table, absolute = long_context.long_report(args, results)
    memory, timing = table.split("Evaluation time")
    assert cells(memory, "alibi")[1:] == ["1.05×", "1.05×", "1.05× ✓", "1.20× ✗ (≤1.10)",
                                          "1.14× ✗ (0.90–1.10)"]
    assert cells(memory, "rope")[3:] == ["1.00× ✓", "failed", "failed"]
    assert cells(timing, "t5")[5:7] == ["1.40× ✗ (≤1.30)", "7.00×"]  # T=16384: time, first call
    assert "eval T=32768: 32.0 MiB, 32.77 s (first call 65.54 s)" in absolute
    line, totals = long_context.long_summary(results)
    assert totals["missed"] == ["alibi eval_mem_32768 1.20×", "alibi per_token 1.14×", "t5 eval_s_16384 1.40×"]
    assert totals["not_measured"] == ["rope eval_mem_32768", "rope per_token"]
    # the CUDA training target is judged on CUDA only
    kernels = {"stock": [("", 1.0)], "kerple-log": [(" auto", 1.3), (" sdpa", 2.6)]}
    train = {name: {"flags": "", "long_errors": {},
                    "long": {f"train T={t}{k}": {"mem_kb": m * t, "best_s": 1.0, "first_s": 1.0}
                             for t in (4096, 8192) for k, m in kernels[name]}} for name in kernels}
    cpu = benchmark.parse_args(["--long-train", "--size", "tiny"])
    long_context.long_ratios(cpu, train)
    assert train["kerple-log"]["targets"] == {} and train["kerple-log"]["ratios"]["train_mem_8192_vs_sdpa"] == 0.5
    assert train["kerple-log"]["ratios"]["train_mem_8192"] == 1.3


def test_benchmark_long_context_arguments_on_cuda(monkeypatch):
    """--long-train (for --device cuda --fp16): per length, stock, then each system with --long-kernel and with
    sdpa (today's mask path), batches of --train-batch sentences on CUDA in float16; the long options without a
    long mode, or a bad value, are refused naming the flag."""
    import pytest
    import torch

    from fairseq_pe.errors import UserError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA Test GPU")
    args = benchmark.parse_args(["--long-train", "--device", "cuda", "--fp16", "--size", "tiny", "--systems", "t5",
                             "--train-lengths", "8192", "4096", "--encoder-layers", "2"])
    assert long_context.long_runs(args, ["stock", "t5"]) == [
        ("train", 4096, "stock", None), ("train", 4096, "t5", "auto"), ("train", 4096, "t5", "sdpa"),
        ("train", 8192, "stock", None), ("train", 8192, "t5", "auto"), ("train", 8192, "t5", "sdpa")]
    t5 = long_context.long_command(args, "t5", "train", "sdpa")
    assert t5[6:10] == ["8", "cuda", "float16", "train"] and t5[11] == "0"  # no address-space limit on CUDA
    assert t5[-4:] == ["--encoder-layers", "2", "--pe-attention-kernel", "sdpa"]
    stock = long_context.long_command(args, "stock", "train")
    assert stock[0] == "stock" and "--pe-attention-kernel" not in stock and stock[-2:] == ["--encoder-layers", "2"]
    assert [c[0] for c in long_context.long_columns(args)[0][1]][:4] == [
        "train mem T=4096", "train time T=4096", "mem vs sdpa T=4096", "time vs sdpa T=4096"]
    both = benchmark.parse_args(["--long", "--long-train", "--long-kernel", "sdpa", "--size", "tiny",
                             "--long-lengths", "64", "--train-lengths", "32", "--memory-limit", "2"])
    assert [r[1:] for r in long_context.long_runs(both, ["stock", "t5"])] == [
        (64, "stock", None), (64, "t5", "sdpa"), (32, "stock", None), (32, "t5", "sdpa")]  # sdpa once
    assert long_context.long_command(both, "t5", "eval", "sdpa")[11] == str(2 * 1024 * 1024)
    for argv, named in ((["--encoder-layers", "1"], "--encoder-layers"), (["--long-kernel", "flex"], "--long-kernel"),
                        (["--long", "--long-lengths", "0"], "--long-lengths"),
                        (["--long-train", "--train-batch", "0"], "--train-batch"),
                        (["--long", "--encoder-only"], "--encoder-only"),
                        (["--long-train", "--device", "cuda", "--memory-limit", "4"], "--memory-limit")):
        with pytest.raises(UserError, match=named):
            benchmark.parse_args(argv + ["--size", "tiny"])


def test_benchmark_language_models_end_to_end(tmp_path):
    """--lm: stock transformer_lm and transformer_lm_pe of the same size, each in a fresh process (stock without the
    plugin): a training step at L and one fairseq-eval-lm sample at 2L and 4L; the table's ratios are the JSON's
    figures over stock's, with the group's target at 16L judged only where 16L is measured."""
    out = tmp_path / "lm"
    cmd = [BENCHMARK, "--out", str(out), "--lm", "--size", "tiny", "--systems", "alibi",
           "--lm-length", "16", "--lm-multiples", "4", "2", "--lm-batch", "2", "--threads", "1", "--repeats", "2",
           "--vocab", "50"]
    proc = cli(*cmd, check=False)  # the script from the tests' fork server; its measurements in fresh processes
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (out / "benchmark-lm.png").read_bytes()[:4] == b"\x89PNG" and not (out / "benchmark.md").exists()
    data = json.loads((out / "benchmark-lm.json").read_text())
    res = data["results"]
    assert list(res) == ["stock", "alibi"] and data["settings"]["lm_multiples"] == [2, 4]
    assert data["settings"]["arch"] == "transformer_lm_pe_tiny" and data["settings"]["stock_arch"] == "transformer_lm"
    # the same model: sizes after the architecture functions (stock's dataclass defaults filled in as fairseq does)
    assert res["stock"]["sizes"] == res["alibi"]["sizes"]
    assert res["stock"]["sizes"]["decoder_layers"] == 2 and res["stock"]["sizes"]["decoder_input_dim"] == 64
    assert res["stock"]["command"][0] == "stock-lm" and res["alibi"]["command"][0] == "plugin-lm"
    assert "--pe-relative" not in res["stock"]["command"]
    assert res["alibi"]["flags"] == "--pe-absolute none --pe-relative alibi"
    assert res["alibi"]["command"][10] == "train:16,eval:32,eval:64"
    for r in res.values():
        assert r["errors"] == {} and set(r["runs"]) == {"train T=16", "eval T=32", "eval T=64"}
        for m in r["runs"].values():
            assert len(m["times_s"]) == 2 and m["best_s"] == min(m["times_s"]) > 0 and m["first_s"] > 0
    ratios = res["alibi"]["ratios"]

    def ratio(run, field):
        base = res["stock"]["runs"][run][field]
        return None if base <= 0 else res["alibi"]["runs"][run][field] / base

    assert ratios["train_s"] == ratio("train T=16", "best_s") and ratios["train_mem"] == ratio("train T=16", "mem_kb")
    assert ratios["eval_s_4L"] == ratio("eval T=64", "best_s") and ratios["eval_mem_2L"] == ratio("eval T=32", "mem_kb")
    # ALiBi's group: the training step's target only (its evaluation targets are at 16L, not measured here)
    assert list(res["alibi"]["targets"]) == ["train_s"] and res["alibi"]["targets"]["train_s"]["target"] == 1.08
    md = (out / "benchmark-lm.md").read_text()
    assert cells(md, "system") == ["system", "train step time L=16", "train step mem L=16", "eval time 2L=32",
                                   "eval mem 2L=32", "eval time 4L=64", "eval mem 4L=64", "targets met"]
    row = cells(md, "alibi")
    met = res["alibi"]["targets"]["train_s"]["met"]
    assert row[1] == f"{ratios['train_s']:.2f}× " + ("✓" if met else "✗ (≤1.08)")
    assert row[5] == ("n/a" if ratios["eval_s_4L"] is None else f"{ratios['eval_s_4L']:.2f}×")
    assert data["summary"]["line"] in md and data["summary"]["line"] in proc.stdout
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[benchmark ")]
    assert any("alibi: train T=16:" in line and "(2/2 done" in line for line in progress)


def test_benchmark_language_model_targets_failures_and_arguments(monkeypatch):
    """--lm's targets (training step; evaluation memory and, for the biases, time at 16L) judged on the ratio as
    printed; a failed measurement (out of memory) is "failed" and not measured; a whole child that fails is an error;
    options of the other modes with --lm, --lm-* without it, a translation --size with it: one line naming them."""
    import pytest

    from fairseq_pe.errors import UserError

    args = benchmark.parse_args(["--lm", "--size", "tiny", "--lm-length", "8"])
    assert args.lm_multiples == [4, 16] and args.arch == "transformer_lm_pe_tiny" and args.size == "tiny"
    assert benchmark.parse_args(["--lm"]).arch == "transformer_lm_pe"
    assert benchmark.parse_args([]).arch == "transformer_pe_wmt_en_de"
    # randomised positions reach past the longest evaluation (16L), the length the models are built for
    assert language_model.lm_system_flags(args, "rope-random")[-1] == str(16 * 8 + 8)
    stock = language_model.lm_command(args, "stock")
    assert stock[3] == str(16 * 8) and "--user-dir" not in stock

    def runs(train, mem16, s16, failed=()):
        figures = {"train T=8": (train, 1000), "eval T=32": (1.0, 100), "eval T=128": (s16, mem16)}
        return {"flags": "", "errors": {k: "out of memory" for k in failed},
                "runs": {k: None if k in failed else {"best_s": s, "mem_kb": m, "first_s": s, "times_s": [s]}
                         for k, (s, m) in figures.items()}}

    results = {"stock": runs(1.0, 1000, 1.0), "alibi": runs(1.084, 1050, 1.31), "ape-sinusoidal": runs(1.0, 1000, 1.0),
               "floater-bias": runs(1.1, 2400, 9.0), "rope": runs(1.0, 1000, 1.0, failed=("eval T=128",))}
    language_model.lm_ratios(args, results)
    assert results["alibi"]["targets"] == {
        "train_s": {"target": 1.08, "ratio": 1.084, "met": True},  # judged as printed: 1.08×
        "eval_mem_16L": {"target": 1.10, "ratio": 1.05, "met": True},
        "eval_s_16L": {"target": 1.3, "ratio": 1.31, "met": False}}
    assert results["floater-bias"]["targets"]["eval_mem_16L"] == {"target": 2.5, "ratio": 2.4, "met": True}
    assert "eval_s_16L" not in results["floater-bias"]["targets"]  # no time target outside the biases read in place
    assert results["rope"]["targets"]["eval_mem_16L"]["met"] is None and results["stock"]["targets"] == {}
    table, absolute, targets = language_model.lm_report(args, results)
    assert cells(table, "alibi")[1:] == ["1.08× ✓", "1.00×", "1.00×", "1.00×", "1.31× ✗ (≤1.30)", "1.05× ✓",
                                         "2/3"]
    assert cells(table, "rope")[5:7] == ["failed", "failed"]
    assert "eval T=128: 1.0 MiB, 1.000 s" in absolute
    assert "| FLOATER Q/K/V biases | floater-bias, floater-warm | ≤1.15 | ≤2.50 |  |" in targets
    for argv, named in ((["--lm", "--updates", "3"], "--updates"), (["--lm", "--long"], "--long"),
                        (["--lm-length", "64"], "--lm-length"), (["--lm", "--size", "wmt"], "--size wmt"),
                        (["--size", "base"], "--size base"), (["--lm", "--lm-multiples", "0"], "--lm-multiples"),
                        (["--lm", "--lm-batch", "0"], "--lm-batch")):
        with pytest.raises(UserError, match=named):
            benchmark.parse_args(argv)
    # a child killed (out of memory) after its training step: the step counts, the evaluations failed; a child that
    # fails otherwise (a bug, a bad flag) stops the benchmark with its output
    stdout = "RESULT train:8 0.5 1000 0.25 0.2\n"
    progress = Progress([("rope", "lm")] * 2)
    for code in (-9, 1):
        monkeypatch.setattr(language_model.subprocess, "run",
                            lambda *a, **k: subprocess.CompletedProcess(a, code, stdout, "boom"))
        if code == -9:
            measured, errors, _ = language_model.lm_measure(args, "rope", {}, progress)
            assert measured["train T=8"] == {"mem_kb": 1000, "first_s": 0.5, "best_s": 0.2, "times_s": [0.25, 0.2]}
            assert measured["eval T=32"] is None and "killed: out of memory?" in errors["eval T=128"]
        else:
            with pytest.raises(MeasurementFailed, match="rope: language model failed .exit status 1"):
                language_model.lm_measure(args, "rope", {}, progress)


def test_stock_and_plugin_models_of_different_sizes_are_refused():
    """Both modes check, through one function, that stock fairseq's model and the plugin's have the same sizes: a
    ratio between models of different sizes would compare nothing; the error names what differs and the options."""
    import pytest

    from fairseq_pe.errors import UserError

    args = benchmark.parse_args(["--lm", "--size", "tiny"])
    stock, plugin = models.check_same_size(args, models.LM_MODEL_FLAGS, models.LM_SIZE_KEYS, lm=True)
    assert stock == plugin
    for argv, model_flags, keys, lm in ((["--lm", "--size", "tiny", "--stock-flags", "--decoder-layers 3"],
                                         models.LM_MODEL_FLAGS, models.LM_SIZE_KEYS, True),
                                        (["--size", "tiny", "--stock-flags", "--encoder-layers 3"],
                                         models.MODEL_FLAGS, models.SIZE_KEYS, False)):
        with pytest.raises(UserError, match=r"--stock-arch .* differ: .*layers .*3 vs 2.*pick a --size"):
            models.check_same_size(benchmark.parse_args(argv), model_flags, keys, lm=lm)
