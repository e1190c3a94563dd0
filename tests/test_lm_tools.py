"""``fairseq-pe-lm-lengths`` (fairseq_pe/lm/extrapolation.py): the mapping of its windows to fairseq-eval-lm's
options, the reading of fairseq-eval-lm's log, the refusals, the seeds' table; end to end on tiny language models
trained here (``transformer_lm_pe_tiny`` with ALiBi and a learned table, stock ``transformer_lm``)."""

import json
import os
import statistics
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
from fairseq.data import data_utils

from fairseq_pe.errors import UserError
from fairseq_pe.lm import extrapolation as ex
from fairseq_pe.lm import lengths_plot, positions

from helpers import PLUGIN, cli, exit_status, forked, counting_lm_data, forked_run

L = 16  # the training length of the tiny models

# fairseq_cli/eval_lm.py's two lines, as its logging writes them
EVAL_LM_LOG = ("2026-01-01 10:00:00 | INFO | fairseq_cli.eval_lm | Evaluated 1,234 tokens in 0.5s (2468.00 tokens/s)\n"
               "2026-01-01 10:00:00 | INFO | fairseq_cli.eval_lm | Loss (base 2): 3.1234, Perplexity: 8.72\n")


def test_windows_map_to_fairseq_options():
    """Non-overlapping: blocks of N (no context); sliding: N tokens of which the last S are scored, fairseq's
    --context-window being subtracted from --tokens-per-sample (fairseq_cli/eval_lm.py)."""
    assert ex.window(64, "nonoverlapping", 16) == (64, 0)
    assert ex.window(64, "sliding", 16) == (64, 48)
    assert ex.window(16, "sliding", 16) == (16, 0)  # N = S: the non-overlapping run
    with pytest.raises(UserError, match="--stride 32 is longer than the evaluation length 16"):
        ex.window(16, "sliding", 32)
    # batches: fairseq counts a window's new tokens only, so 8192 tokens with their context are 128 windows of 64
    assert ex.batch_max_tokens(8192, 64, 48) == 128 * 16 and ex.batch_max_tokens(8192, 64, 0) == 8192
    assert ex.batch_max_tokens(32, 64, 48) == 16  # one window at least


def test_eval_lm_log_is_read_strictly():
    assert ex.parse_eval_lm(EVAL_LM_LOG) == {"tokens": 1234, "loss_base2": 3.1234, "perplexity": 8.72,
                                             "inf_skipped": False}
    with pytest.raises(ValueError, match="found 1 and 0"):
        ex.parse_eval_lm(EVAL_LM_LOG.splitlines()[0])
    with pytest.raises(ValueError, match="found 2 and 2"):
        ex.parse_eval_lm(EVAL_LM_LOG * 2)
    skipped = ex.parse_eval_lm("INFO | skipping tokens with inf scores: w1\n" + EVAL_LM_LOG)
    with pytest.raises(UserError, match="infinite score"):
        ex.check_point(skipped, 1234, "here")
    # stock fairseq's "Evaluated 0 tokens ... Perplexity: 1.00" (issue 42) is an error naming the point
    zero = ex.parse_eval_lm(EVAL_LM_LOG.replace("1,234", "0"))
    with pytest.raises(UserError, match="here: fairseq-eval-lm evaluated 0 of the split's 1,234 tokens"):
        ex.check_point(zero, 1234, "here")
    ex.check_point(ex.parse_eval_lm(EVAL_LM_LOG), 1234, "here")


def test_refusals_are_user_errors_past_the_training_length():
    named = "fairseq-eval-lm: error: evaluate with a --tokens-per-sample of at most 16\n"
    table = "fairseq-eval-lm: error: --pe-absolute learned: a sequence of 64 tokens needs position 63\n"
    assert ex.refusal(2, "INFO | x\n" + named, past_training_length=False) == named[len("fairseq-eval-lm: error: "):-1]
    assert ex.refusal(2, table, past_training_length=True).startswith("--pe-absolute learned")
    assert ex.refusal(2, table, past_training_length=False) is None  # at L: the run is broken, not refused
    assert ex.refusal(1, named, past_training_length=True) is None  # a crash
    assert ex.refusal(2, "usage: fairseq-eval-lm [-h]\n" + named, past_training_length=True) is None  # bad option
    # any other user error is the run's, past L too (a batch too small for a window was recorded as ALiBi's refusal)
    batch = ("fairseq-eval-lm: error: --max-tokens 512 cannot hold one window's 1024 scored tokens "
             "(--tokens-per-sample): give at least 1024\n")
    assert ex.refusal(2, batch, past_training_length=True) is None
    plus = "fairseq-eval-lm: error: evaluate with a --tokens-per-sample (plus --context-window) of at most 16 (x)\n"
    assert ex.refusal(2, plus, past_training_length=True) == plus[len("fairseq-eval-lm: error: "):-1]


def test_checkpoints_by_name_are_seeds(tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    a.write_bytes(b"x")
    b.write_bytes(b"x")
    assert ex.parse_checkpoints([f"rope={a}", f"alibi={b}", f"rope={b}"]) == {"rope": [str(a), str(b)],
                                                                               "alibi": [str(b)]}
    for spec, message in ((str(a), "expected NAME=PATH"), (f"rope={tmp_path}/c.pt", "no such file"),
                          (f"=={a}", "expected NAME=PATH")):
        with pytest.raises(UserError, match=message):
            ex.parse_checkpoints([spec])
    with pytest.raises(UserError, match="given twice"):
        ex.parse_checkpoints([f"rope={a}", f"rope={a}"])


def test_own_options_are_refused_in_eval_lm_args(capsys):
    with pytest.raises(SystemExit) as e:
        ex.parse_args(["--checkpoint", "a=b", "--data", "d", "--train-length", "16", "--out", "o",
                       "--eval-lm-args", "--fp16 --context-window=8"])
    assert e.value.code == 2 and "--eval-lm-args: --context-window=8 is set by this tool" in capsys.readouterr().err


def test_seeds_give_mean_sample_sd_and_every_value():
    runs = [{"perplexity": p, "loss_base2": 1.0, "tokens": 82} for p in (10.0, 12.0, 14.5)]
    cell = ex.combine(runs)
    assert cell["perplexity"] == pytest.approx(36.5 / 3)
    assert cell["perplexity_sd"] == pytest.approx(statistics.stdev([10.0, 12.0, 14.5]))  # n - 1
    assert cell["perplexity_seeds"] == [10.0, 12.0, 14.5] and cell["seeds"] == 3
    assert ex.combine([runs[0], {"refused": "too long"}]) == {"refused": "too long", "seeds": 2}
    assert ex.combine(runs[:1])["perplexity_sd"] is None
    report = {"train_length": 16, "lengths": [16, 32], "modes": ["sliding"], "stride": 16, "data": "d",
              "gen_subset": "test", "split_tokens": 82, "checkpoints": {"rope": ["a", "b", "c"]},
              "results": {"rope": {"sliding": {"16": cell, "32": {"refused": "too long", "seeds": 3}}}}}
    table = ex.markdown(report)
    assert "| system | 16 (1×) | 32 (2×) |" in table and "| rope | 12.17 ± 2.25 | refused |" in table
    assert "- rope, sliding, N = 32: too long" in table and "--context-window N-16" in table
    assert "| rope | 2 | 12.00 | refused |" in table and "| rope | 3 | 14.50 | refused |" in table  # every seed


def test_the_plot_keeps_a_long_legend_off_the_curves(tmp_path):
    """With many systems (docs/lm-cpu-extrapolation.png has 26) the legend goes beside the panel, in columns: the
    figure is wider than a plot of one system (before, both were the same size and the legend covered the curves)."""
    from PIL import Image

    cell = {"perplexity": 10.0, "perplexity_sd": 1.0, "perplexity_seeds": [9.0, 10.0, 11.0], "seeds": 3}
    widths = {}
    for count in (1, 26):
        names = [f"system-{i}" for i in range(count)]
        report = {"train_length": 16, "lengths": [16, 32], "modes": ["nonoverlapping"], "stride": 16,
                  "gen_subset": "test", "checkpoints": {n: ["a"] for n in names},
                  "results": {n: {"nonoverlapping": {"16": cell, "32": cell}} for n in names}}
        lengths_plot.plot_lengths(report, str(tmp_path / f"{count}.png"))
        widths[count] = Image.open(tmp_path / f"{count}.png").size[0]
    assert widths[26] > widths[1] * 1.4, widths


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    """80 lines of counting sequences over 30 words, binarised for --task language_modeling."""
    root = tmp_path_factory.mktemp("lm")
    return counting_lm_data(root)


def train_lm(data, save_dir, *flags, user_dir=True):
    cli("fairseq-train", data, "--task", "language_modeling", "--tokens-per-sample", str(L),
        "--sample-break-mode", "none", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "128",
        "--max-update", "2", "--cpu", "--num-workers", "0", "--save-dir", save_dir, "--no-epoch-checkpoints",
        "--disable-validation", "--log-format", "simple", "--seed", "1", *(["--user-dir", PLUGIN] if user_dir else []),
        *flags)
    return os.path.join(save_dir, "checkpoint_last.pt")


def test_alibi_and_a_learned_table_at_1x_and_4x(lm_data, tmp_path, monkeypatch, capsys):
    """ALiBi scores every token of the split at 4 L in both modes; a learned table is refused past L, by name,
    and the table goes on; the sliding run at N = L is the non-overlapping one (run once)."""
    from fairseq_pe import systems

    alibi = train_lm(lm_data, tmp_path / "alibi", "--arch", "transformer_lm_pe_tiny", *systems.flags("alibi"))
    learned = train_lm(lm_data, tmp_path / "learned", "--arch", "transformer_lm_pe_tiny",
                       *systems.flags("ape-learned"))
    out = tmp_path / "out"
    argv = ["--data", str(lm_data), "--train-length", str(L), "--multipliers", "1", "4",
            "--checkpoint", f"alibi={alibi}", f"ape-learned={learned}", "--out", str(out)]
    # the tool in this process, each fairseq-eval-lm forked from the tests' server (a new interpreter each costs
    # 10 s: test_stock_model_that_skips_samples_is_an_error runs the tool and fairseq-eval-lm as a user does)
    monkeypatch.setattr(ex, "subprocess", SimpleNamespace(run=forked_run, PIPE=subprocess.PIPE,
                                                          STDOUT=subprocess.STDOUT))
    assert exit_status(ex.main, argv) == 0
    run = SimpleNamespace(stdout=capsys.readouterr().out)
    report = json.loads((out / "lengths.json").read_text())
    dataset = data_utils.load_indexed_dataset(str(lm_data / "test"), None)
    tokens = int(dataset.sizes.sum())
    assert report["split_tokens"] == tokens and report["lengths"] == [16, 64]
    res = report["results"]
    for mode in ("nonoverlapping", "sliding"):
        for n in ("16", "64"):
            assert res["alibi"][mode][n]["tokens"] == tokens and res["alibi"][mode][n]["perplexity"] > 1
        assert res["ape-learned"][mode]["16"]["tokens"] == tokens
        assert "refused" in res["ape-learned"][mode]["64"]
    assert res["alibi"]["sliding"]["64"]["context_window"] == 48
    assert "--tokens-per-sample" in res["ape-learned"]["nonoverlapping"]["64"]["refused"]
    assert res["alibi"]["sliding"]["16"]["perplexity"] == res["alibi"]["nonoverlapping"]["16"]["perplexity"]
    assert len(report["runs"]) == 6 and "[5/6]" in run.stdout  # 3 windows per checkpoint, the learned 6th not run
    assert sorted(os.listdir(out / "logs")) == ["alibi-1-T16-C0.log", "alibi-1-T64-C0.log", "alibi-1-T64-C48.log",
                                                "ape-learned-1-T16-C0.log", "ape-learned-1-T64-C0.log"]
    table = (out / "lengths.md").read_text()
    assert "| ape-learned | " in table and "| refused |" in table and (out / "lengths.png").stat().st_size > 10_000
    assert exit_status(ex.main, argv) == 2  # an earlier result is kept
    assert "pass --force" in capsys.readouterr().err


def test_stock_model_that_skips_samples_is_an_error(lm_data, tmp_path):
    """Stock transformer_lm at 2 L: fairseq skips the samples longer than L and prints a perplexity over the rest
(over 0 tokens in issue 42's example);
    the tool stops, naming the checkpoint, the length and the options."""
    with forked():  # its training from the fork server, the tools fresh
        stock = train_lm(lm_data, tmp_path / "stock", "--arch", "transformer_lm", "--decoder-layers", "1",
                         "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads",
                         "2", user_dir=False)
    dataset = data_utils.load_indexed_dataset(str(lm_data / "test"), None)
    tokens = int(dataset.sizes.sum())  # blocks of 32: only the short last one is within the model's limit
    stock_run = cli("fairseq-eval-lm", lm_data, "--path", stock, "--gen-subset", "test", "--tokens-per-sample", "32",
                    "--sample-break-mode", "none", "--max-tokens", "64")  # exit 0, a perplexity over part of the split
    assert f"Evaluated {tokens % 32:,} tokens" in stock_run.stdout + stock_run.stderr
    run = cli("fairseq-pe-lm-lengths", "--data", lm_data, "--train-length", str(L), "--multipliers", "2",
              "--modes", "nonoverlapping", "--checkpoint", f"stock={stock}", "--out", tmp_path / "out", check=False)
    assert run.returncode == 2, run.stderr
    assert (f"--checkpoint stock={stock} at --tokens-per-sample 32 --context-window 0: fairseq-eval-lm evaluated "
            f"{tokens % 32} of the split's {tokens} tokens") in run.stderr and "--multipliers" in run.stderr
    assert not (tmp_path / "out" / "lengths.json").exists()


def test_the_wiki103_recipe_commands_parse(tmp_path):
    """scripts/recipes/lm-wiki103.sh with DRY_RUN=1: ALiBi's training command per system and length, read by
    fairseq's own parser with the plugin (every option exists; the architecture is the wiki103 one with adaptive
    input and softmax), and the evaluation by fairseq-pe-lm-lengths' parser."""
    import shlex
    import subprocess
    import sys

    from fairseq import options

    from helpers import REPO

    env = dict(os.environ, DRY_RUN="1", LENGTHS="512 1024", SYSTEMS="alibi ape-learned", NUM_GPUS="2",
               PYTHON=sys.executable)
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "recipes", "lm-wiki103.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=True)
    commands = [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert commands[0][0] == "fairseq-pe-prepare-wikitext" and not os.listdir(tmp_path)
    trains = [c for c in commands if c[0] == "fairseq-train"]
    assert len(trains) == 4
    for c in trains:
        args = options.parse_args_and_arch(options.get_training_parser(), c[1:])
        assert args.arch == "transformer_lm_pe_wiki103" and args.adaptive_input and args.adaptive_softmax_cutoff
        assert args.tokens_per_sample in (512, 1024) and args.max_tokens * args.update_freq[0] * 2 == 8 * 9216
        assert args.lr_scheduler == "cosine" and args.max_update == 286000 and args.criterion == "adaptive_loss"
    lengths = [ex.parse_args(c[1:]) for c in commands if c[0] == "fairseq-pe-lm-lengths"]
    assert [a.train_length for a in lengths] == [512, 512, 1024, 1024] and lengths[0].eval_lm_args == "--fp16"
    assert lengths[0].multipliers == [1, 2, 4, 8, 16] and lengths[0].modes == ["nonoverlapping", "sliding"]
    # then ALiBi's own sliding evaluation at L: windows of L tokens, each scoring its last one
    assert all(a.multipliers == [1] and a.modes == ["sliding"] and a.stride == 1 and a.resume
               for a in lengths[1::2])
    assert [a.out.endswith("lengths-stride1") for a in lengths] == [False, True, False, True]
    assert [c.split("=")[0] for c in lengths[1].checkpoint] == ["alibi", "ape-learned"]


def test_jobs_evaluate_checkpoints_in_parallel_with_the_same_results(tmp_path, monkeypatch):
    """``--jobs 3``: three checkpoints' runs overlap, each checkpoint's windows still in order (shorter first, a
    refusal skipping the longer ones), and the report is that of ``--jobs 1``; the first error stops the others
    at their next window."""
    import threading
    import time

    calls, active, peak, lock = [], [0], [0], threading.Lock()

    def fake_point(args, path, T, C, expected, log_path, where):
        with lock:
            calls.append((path, T, C))
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        if "broken" in path and T > L:
            raise UserError(f"{where}: broken")
        if "learned" in path and T > L:
            return {"refused": "--tokens-per-sample past the table", "seconds": 0.0}
        counts = np.zeros(T, dtype=np.int64)
        for start, size in positions.blocks(82, T, C):
            counts[start:start + size] += 1
        return {"perplexity": 10.0 + T / 100 + C / 1000 + len(path), "loss_base2": 3.0, "tokens": 82, "seconds": 0.1,
                "curve": (3.0 * counts, counts)}

    monkeypatch.setattr(ex, "run_point", fake_point)
    monkeypatch.setattr(ex, "split_tokens", lambda data, subset: 82)
    paths = {}
    for name in ("alibi-1", "alibi-2", "learned"):
        paths[name] = tmp_path / f"{name}.pt"
        paths[name].write_text("")
    checkpoints = [f"alibi={paths['alibi-1']}", f"alibi={paths['alibi-2']}", f"ape-learned={paths['learned']}"]

    def report(jobs, out):
        calls.clear()
        peak[0] = 0
        argv = ["--data", str(tmp_path), "--train-length", str(L), "--multipliers", "1", "2", "4", "--jobs", str(jobs),
                "--checkpoint", *checkpoints, "--out", str(tmp_path / out)]
        return ex.evaluate(ex.parse_args(argv))

    one = report(1, "one")
    assert peak[0] == 1 and len(calls) == 3 * 5 - 3  # 5 windows each; the learned table's 2 after its refusal not run
    three = report(3, "three")
    assert peak[0] == 3
    for path in paths.values():  # each checkpoint's windows in the order of --jobs 1
        assert [c for c in calls if c[0] == str(path)] == sorted(c for c in calls if c[0] == str(path))
    assert three["results"] == one["results"] and three["runs"] == one["runs"]
    assert three["results"]["ape-learned"]["sliding"]["64"]["refused"].startswith("not run: refused at N = 32")

    broken = tmp_path / "broken.pt"
    broken.write_text("")
    checkpoints.append(f"broken={broken}")
    with pytest.raises(UserError, match="broken"):
        report(4, "broken")
    assert len(calls) <= 4 * 3  # the others stopped at their next window (else 5 + 5 + 3 + 2 = 15)


def test_an_interrupted_evaluation_resumes_from_its_run_records(tmp_path, monkeypatch):
    """An evaluation stopped by an error after some runs: ``--resume`` reads the finished runs back from
    ``--out/runs`` (their curves as the same float64 and int64 arrays) and runs only the rest, and the report is that
    of one uninterrupted evaluation.  Without ``--resume`` everything runs again; a checkpoint whose contents
    changed, or another --max-tokens, runs again even with it.  Catches a key without the checkpoint's hash or the
    options, a reuse without --resume, and a record whose curve comes back as other values or types."""
    calls, fail_at = [], []

    def fake_point(args, path, T, C, expected, log_path, where):
        if (os.path.basename(path), T, C) in fail_at:
            raise UserError(f"{where}: interrupted")
        calls.append((os.path.basename(path), T, C))
        if "learned" in path and T > L:
            return {"refused": "--tokens-per-sample past the table", "seconds": 0.0}
        counts = np.zeros(T, dtype=np.int64)
        for start, size in positions.blocks(82, T, C):
            counts[start:start + size] += 1
        sums = counts * (3.0 + T / 7 + len(open(path).read()) / 3)  # not a short binary fraction: round trips tested
        return {"perplexity": 2 ** (sums.sum() / 82), "loss_base2": sums.sum() / 82, "tokens": 82,
                "seconds": 0.1 * T, "curve": (sums, counts)}

    monkeypatch.setattr(ex, "run_point", fake_point)
    monkeypatch.setattr(ex, "split_tokens", lambda data, subset: 82)
    for name, text in (("alibi-1", "a"), ("alibi-2", "bb"), ("learned", "c")):
        (tmp_path / f"{name}.pt").write_text(text)
    checkpoints = [f"alibi={tmp_path / 'alibi-1.pt'}", f"alibi={tmp_path / 'alibi-2.pt'}",
                   f"ape-learned={tmp_path / 'learned.pt'}"]

    def report(out, *extra):
        calls.clear()
        argv = ["--data", str(tmp_path), "--train-length", str(L), "--multipliers", "1", "2", "4",
                "--checkpoint", *checkpoints, "--out", str(tmp_path / out), *extra]
        return ex.evaluate(ex.parse_args(argv))

    whole = report("whole")
    all_runs = list(calls)
    assert len(all_runs) == 12
    fail_at.append(("alibi-2.pt", 2 * L, 0))
    with pytest.raises(UserError, match="interrupted"):
        report("cut")
    done_before = list(calls)
    # a record per finished run: alibi-1's 5 and alibi-2's first (ape-learned's first too when its thread took it
    # before the error stopped the others)
    assert not (tmp_path / "cut" / "lengths.json").exists() and 6 <= len(done_before) <= 7
    assert len(os.listdir(tmp_path / "cut" / "runs")) == len(done_before)
    fail_at.clear()
    resumed = report("cut", "--resume")
    assert sorted(calls) == sorted(set(all_runs) - set(done_before))  # only what had not run
    assert resumed["results"] == whole["results"] and resumed["runs"] == whole["runs"]
    assert resumed["seconds"] == whole["seconds"]  # the recorded runs keep the seconds measured then
    for name in ("positions.json", "lengths.md"):
        assert (tmp_path / "cut" / name).read_text() == (tmp_path / "whole" / name).read_text()

    with pytest.raises(UserError, match="--force"):
        report("cut", "--resume")  # its outputs exist now: replacing them is asked for with --force
    report("cut", "--force")
    assert sorted(calls) == sorted(all_runs)  # no --resume: every run runs
    (tmp_path / "learned.pt").write_text("another checkpoint")
    report("cut", "--force", "--resume")
    assert sorted(calls) == [("learned.pt", L, 0), ("learned.pt", 2 * L, 0)]  # its 2 runs; the refusal skips 4 more
    report("cut", "--force", "--resume", "--max-tokens", "4096")
    assert sorted(calls) == sorted(all_runs)
