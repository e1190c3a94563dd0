"""The benchmark script runs end to end (tiny settings; it measures, it does not assert speed)."""

import json
import os
import subprocess
import sys

from helpers import REPO


def test_benchmark_script_smoke(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "benchmark_positions.py"), "--out", str(out),
         "--arch", "transformer_pe_tiny", "--systems", "rpe-learned", "floater-bias", "--updates", "2",
         "--max-tokens", "500", "--sentences", "60", "--gen-sentences", "5", "--gen-len", "6",
         "--lengths", "64", "--threads", "1", "--repeats", "2"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((out / "benchmark.json").read_text())["results"]
    assert list(res) == ["ape-sinusoidal", "rpe-learned", "floater-bias"]
    for r in res.values():
        assert r["train_s"] > 0 and r["generate_s"] > 0 and r["train_peak_kb"] > 0
        assert len(r["train_s_rounds"]) == 2 and r["train_s"] == min(r["train_s_rounds"])
        assert set(r["encoder_forward_extra_kb"]) == {"64"}
    lines = (out / "benchmark.md").read_text().splitlines()
    assert any(line.startswith("| ape-sinusoidal | 1.00× | 1.00× | 1.00× | 1.00× |") for line in lines)
    assert any(line.startswith("| rpe-learned |") for line in lines)
    assert any(line.startswith("| floater-bias |") for line in lines)


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
