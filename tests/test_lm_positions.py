"""``fairseq-pe-lm-lengths``' loss by token position (fairseq_pe/lm/positions.py) and its pictures
(fairseq_pe/lm/lengths_plot.py): the reading of fairseq-eval-lm's ``--output-word-probs`` lines, the place of each
scored token in its window, the buckets and bins, the panel of diverging systems; end to end against a per-token
brute force through the model itself."""

import json
import math
import os
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fairseq_pe.errors import UserError
from fairseq_pe.lm import extrapolation as ex
from fairseq_pe.lm import lengths_plot, positions

from helpers import PLUGIN, cli, exit_status, counting_lm_data, forked_run

PIPE_FORMAT = "2026-01-01 10:00:00 | INFO | fairseq_cli.eval_lm | "  # fairseq_cli/eval_lm.py's logging format
PLAIN_FORMAT = "INFO:fairseq_cli.eval_lm:"  # when logging was configured before eval_lm's basicConfig


def word_probs_line(sample_id, items, prefix=PIPE_FORMAT):
    """A line as fairseq_cli/eval_lm.py prints it: ``ID WORD [SCORE:2f]\\tWORD [SCORE:2f]...``."""
    return prefix + str(sample_id) + " " + "\t".join("{} [{:2f}]".format(w, s) for w, s in items)


def test_word_probability_lines_are_read_by_each_items_trailing_score():
    """Every item ends in `` [NUMBER]``; a token with spaces, brackets or a number in brackets is read whole, in
    both of the logging formats fairseq-eval-lm prints (``| INFO | NAME |`` and ``INFO:NAME:``)."""
    odd = [("w1", -1.5), ("a [b]", -0.25), ("[0.5]", -2.0), ("x [1.0] y", -3.125), ("</s>", 0.0), ("[", -1e-7),
           ("]", -7.0)]
    log = "\n".join([PIPE_FORMAT + "num. model params: 1,234", word_probs_line(0, odd),
                     word_probs_line(12, [("w2", -0.5)], PLAIN_FORMAT),
                     PIPE_FORMAT + "data-bin 3 test 2 examples", PIPE_FORMAT + "Evaluated 8 tokens in 0.1s"])
    assert positions.word_prob_lines(log) == [(0, [-1.5, -0.25, -2.0, -3.125, 0.0, -0.0, -7.0]), (12, [-0.5])]
    with pytest.raises(ValueError, match="unreadable word probabilities"):
        positions.parse_items("w1 [-1.0]\tw2 -2.0]")
    stripped = positions.strip_word_probs(log)
    assert "num. model params" in stripped and "Evaluated 8 tokens" in stripped and "[-1.5" not in stripped
    assert "[2 --output-word-probs lines left out" in stripped


def test_windows_place_their_tokens_after_their_context():
    """Block b's k-th new token sits at min(C, b S) + k: the first blocks of a sliding evaluation have less
    context than C, the last block may be shorter; non-overlapping blocks start at 0."""
    assert positions.blocks(10, 8, 6) == [(0, 2), (2, 2), (4, 2), (6, 2), (6, 2)]  # S = 2, C = 6
    assert positions.blocks(11, 8, 5) == [(0, 3), (3, 3), (5, 3), (5, 2)]  # S = 3: the last block of 2
    assert positions.blocks(10, 4, 0) == [(0, 4), (0, 4), (0, 2)]
    assert positions.blocks(5, 4, 3) == [(0, 1), (1, 1), (2, 1), (3, 1), (3, 1)]  # stride 1

    def log(blocks, order=None):
        order = range(len(blocks)) if order is None else order
        return "\n".join(word_probs_line(b, [(f"w{b}.{k}", -math.log(2) * (blocks[b][0] + k + 1))
                                             for k in range(blocks[b][1])]) for b in order)

    blocks = positions.blocks(11, 8, 5)
    sums, counts = positions.position_curve(log(blocks), 11, 8, 5)
    assert counts.tolist() == [1, 1, 1, 1, 1, 3, 2, 1]  # positions 1..8
    assert np.allclose(sums / np.maximum(counts, 1), [1, 2, 3, 4, 5, 6, 7, 8])  # each token's loss: its position
    positions.check_curve(sums, counts, 11, float(sums.sum() / 11))
    with pytest.raises(ValueError, match="out of order"):
        positions.position_curve(log(blocks, [0, 2, 1, 3]), 11, 8, 5)
    with pytest.raises(ValueError, match="4 blocks"):
        positions.position_curve(log(blocks, [0, 1, 3]), 11, 8, 5)
    with pytest.raises(ValueError, match="sample 3 has 2 scores, its block 3 tokens"):
        positions.position_curve(log(blocks), 12, 8, 5)  # 12 tokens: the last block has 3
    shuffled = positions.blocks(10, 4, 0)
    sums, counts = positions.position_curve(log(shuffled, [2, 0, 1]), 10, 4, 0)  # by size, as fairseq batches them
    assert counts.tolist() == [3, 3, 2, 2]
    with pytest.raises(ValueError, match="count 10 tokens, the split 11"):
        positions.check_curve(sums, counts, 11, 1.0)
    with pytest.raises(ValueError, match="fairseq printed 2.1000"):
        positions.check_curve(sums, counts, 10, 2.1)
    with pytest.raises(ValueError, match="fairseq printed nan"):
        positions.check_curve(sums, counts, 10, math.nan)
    positions.check_curve(sums * math.nan, counts, 10, math.nan)  # NaN scores, a NaN loss: recorded as they are


def test_buckets_and_bins_cover_every_position_once():
    assert positions.buckets(16, 64) == [(1, 4), (5, 8), (9, 12), (13, 16), (17, 32), (33, 64)]
    assert positions.buckets(16, 48)[-2:] == [(17, 32), (33, 48)] and positions.buckets(16, 16)[-1] == (13, 16)
    assert positions.buckets(2, 4) == [(1, 1), (2, 2), (3, 4)]
    edges = positions.bin_edges(100)
    assert edges[:16] == list(range(1, 17)) and edges[-1] == 100 and edges == sorted(set(edges))
    curve = positions.combine_curves([(np.array([2.0, 4.0, 0.0, 9.0]), np.array([1, 2, 0, 3])),
                                      (np.array([4.0, 8.0, 0.0, 3.0]), np.array([1, 2, 0, 3]))])
    assert curve["count"] == [1, 2, 0, 3] and curve["loss_base2_seeds"] == [[2.0, 2.0, None, 3.0],
                                                                            [4.0, 4.0, None, 1.0]]
    assert curve["loss_base2"] == [3.0, 3.0, None, 2.0] and curve["loss_base2_sd"][0] == round(math.sqrt(2), 5)
    b = positions.binned(curve, per_octave=1)  # bins 1, 2, 3-4
    assert b["x"] == [1.0, 2.0, math.sqrt(12)] and b["mean"] == [3.0, 3.0, 2.0]
    buckets = positions.bucket_values([(np.array([2.0, 4.0, 0.0, 9.0]), np.array([1, 2, 0, 3]))], [(1, 2), (3, 4)])
    assert [(x["tokens"], x["loss_base2"]) for x in buckets] == [(3, 2.0), (3, 3.0)]


def test_the_sliding_panel_shows_each_lengths_scored_positions_only():
    """Sliding windows of N tokens scoring their last S: positions 1..N − S hold the split's first windows alone, one
    token each (their context shorter), and are left out of the picture; a refused length is left out whole.
    Catches the panel drawing a single run's every position (the split's first tokens as noise across 1..N − S)."""
    def curve(n, stride, tokens):
        counts = np.zeros(n, dtype=np.int64)
        for start, size in positions.blocks(tokens, n, n - stride):
            counts[start:start + size] += 1
        return positions.combine_curves([(3.0 * counts, counts)])

    cells = {"8": curve(8, 8, 65), "16": curve(16, 8, 65), "32": {"refused": "no"}}
    segments = lengths_plot.scored_segments(cells, 8)
    assert [n for n, _ in segments] == [8, 16]
    assert segments[0][1]["count"] == cells["8"]["count"]  # N = S: every position scored
    assert cells["16"]["count"][:8] == [1] * 8  # the first window's tokens, before the cut
    assert segments[1][1]["count"] == [0] * 8 + cells["16"]["count"][8:] and sum(segments[1][1]["count"]) == 65 - 8
    assert segments[1][1]["loss_base2"] == cells["16"]["loss_base2"]


def relative_report(ratios):
    """A report of one length (1 x and 4 x L) per system with the given relative perplexities at 4 L."""
    def cell(ratio):
        return {"perplexity": 10.0 * ratio, "perplexity_sd": None, "perplexity_seeds": [10.0 * ratio], "seeds": 1,
                "relative": ratio, "relative_sd": None, "relative_seeds": [ratio]}

    return {"train_length": 16, "lengths": [16, 64], "modes": ["nonoverlapping"], "stride": 16, "gen_subset": "test",
            "checkpoints": {s: ["a"] for s in ratios},
            "results": {s: {"nonoverlapping": {"16": cell(1.0), "64": cell(r)}} for s, r in ratios.items()}}


def test_a_diverging_system_gets_its_own_panel(tmp_path):
    """A system past 1.5x its perplexity at L (FLOATER's 8x) goes to a third panel, the others (1.1x, 1.4x) share
    the relative panel: the picture is a panel wider than without it."""
    from PIL import Image

    spread = relative_report({"alibi": 1.1, "rope": 1.4, "floater": 8.0})
    assert lengths_plot.diverging(spread, "nonoverlapping") == ["floater"]
    close = relative_report({"alibi": 1.1, "rope": 1.4})
    assert lengths_plot.diverging(close, "nonoverlapping") == []
    for name, report in (("spread", spread), ("close", close)):
        lengths_plot.plot_lengths(report, str(tmp_path / f"{name}.png"))
    wide, narrow = (Image.open(tmp_path / f"{n}.png").size[0] for n in ("spread", "close"))
    assert wide > narrow * 1.3, (wide, narrow)
    spread["diverging"] = {"ratio": 1.5, "systems": {"nonoverlapping": ["floater"]}}
    table = ex.markdown(dict(spread, data="d", split_tokens=80))
    assert "its own panel of lengths.png: floater)" in table and "| floater | 1.000 | 8.000 |" in table


def test_an_explosion_puts_the_diverging_panel_on_a_log_axis(monkeypatch, tmp_path):
    """FLOATER's 8x beside RoPE's 1.8x: the diverging panel turns log (base 2), so that RoPE's curve is not flattened
    against 1; RoPE's 1.8x and the sinusoidal APE's 1.6x alone stay linear, as does the panel within 1.5x.  Catches a
    diverging panel that is always linear (the issue's flattened curves) or always log."""
    from fairseq_pe.plotting import pyplot

    plt = pyplot()
    scales = {}
    real_close = plt.close

    def keep(fig):
        scales[len(scales)] = [(ax.get_title(), ax.get_yscale()) for ax in fig.axes]
        real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    lengths_plot.plot_lengths(relative_report({"alibi": 1.1, "rope": 1.8, "floater": 8.0}), str(tmp_path / "a.png"))
    lengths_plot.plot_lengths(relative_report({"alibi": 1.1, "rope": 1.8, "ape-sin": 1.6}), str(tmp_path / "b.png"))
    (_, absolute), (_, within), (title, exploding) = scales[0]
    assert (absolute, within, exploding) == ("log", "linear", "log") and title.endswith("log scale")
    assert [scale for _, scale in scales[1]] == ["log", "linear", "linear"]


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    """Counting lines over 30 words, binarised for --task language_modeling: a test split of 65 tokens (a multiple
    of none of the lengths and strides below)."""
    root = tmp_path_factory.mktemp("lm-positions")
    return counting_lm_data(root)


@pytest.fixture(scope="module")
def alibi(lm_data, tmp_path_factory):
    """ALiBi trained at 16 tokens for 3 updates."""
    from fairseq_pe import systems

    save = tmp_path_factory.mktemp("alibi")
    cli("fairseq-train", lm_data, "--task", "language_modeling", "--tokens-per-sample", "16", "--sample-break-mode",
        "none", "--optimizer", "adam", "--lr", "3e-3", "--max-tokens", "128", "--max-update", "3", "--cpu",
        "--num-workers", "0", "--save-dir", save, "--no-epoch-checkpoints", "--disable-validation", "--log-format",
        "simple", "--seed", "1", "--user-dir", PLUGIN, "--arch", "transformer_lm_pe_tiny", *systems.flags("alibi"))
    return str(save / "checkpoint_last.pt")


def run_tool(monkeypatch, out, *argv):
    monkeypatch.setattr(ex, "subprocess", SimpleNamespace(run=forked_run, PIPE=subprocess.PIPE,
                                                          STDOUT=subprocess.STDOUT))
    assert exit_status(ex.main, [*argv, "--out", str(out)]) == 0
    return json.loads((out / "lengths.json").read_text()), json.loads((out / "positions.json").read_text())


def brute_force(checkpoint, data, tokens_per_sample, context):
    """Each token's loss (base 2) and window position (0-based), from one forward pass per token over exactly the
    inputs its window holds up to it.  fairseq's convention (TokenBlockDataset with include_targets,
    --sample-break-mode none): the input is the split's token stream shifted right by one, the end-of-sentence
    symbol first (the split's first token is predicted from ``</s>``), so the token j of block b = j // S (S = T - C
    new tokens per block) is predicted from the inputs ``x[start .. j]`` (x[i] = token i - 1), the window starting
    C tokens before its block, at 0 at the latest: start = max(0, b S - C)."""
    from fairseq import checkpoint_utils
    from fairseq.data import data_utils

    # the plugin's models are registered: this module imports fairseq_pe (its package runs at the first import)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": str(data)})
    model, d = models[0].eval(), task.source_dictionary
    split = data_utils.load_indexed_dataset(os.path.join(data, "test"), d)
    stream = torch.cat([split[i] for i in range(len(split))])
    inputs = torch.cat([stream.new([d.eos()]), stream[:-1]])
    new = tokens_per_sample - context
    losses, places = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is faster than several contending
    with torch.no_grad():
        for j in range(len(stream)):
            start = max(0, (j // new) * new - context)
            lprobs = model.get_normalized_probs(model(inputs[start:j + 1][None]), log_probs=True)
            losses.append(-lprobs[0, -1, stream[j]].item() / math.log(2))
            places.append(j - start)
    torch.set_num_threads(threads)
    return np.array(losses), np.array(places)


def assert_same_curve(report, curves, mode, n, checkpoint, data):
    T, C = report["results"]["alibi"][mode][str(n)]["tokens_per_sample"], report["results"]["alibi"][mode][str(n)][
        "context_window"]
    losses, places = brute_force(checkpoint, data, T, C)
    curve = curves["results"]["alibi"][mode][str(n)]
    counts = np.bincount(places, minlength=n)
    assert curve["count"] == counts.tolist() and sum(curve["count"]) == report["split_tokens"] == len(losses)
    expected = [float(losses[places == p].mean()) if counts[p] else None for p in range(n)]
    assert [v is None for v in curve["loss_base2"]] == [v is None for v in expected]
    got = np.array([v for v in curve["loss_base2"] if v is not None])
    np.testing.assert_allclose(got, [v for v in expected if v is not None], atol=1e-4, err_msg=f"{mode} N = {n}")
    assert report["results"]["alibi"][mode][str(n)]["loss_base2_seeds"][0] == pytest.approx(losses.mean(), abs=1e-4)


def test_loss_by_position_is_the_models_per_token_loss(lm_data, alibi, tmp_path, monkeypatch):
    """Non-overlapping and sliding windows (stride 3: the first blocks with less context, a last block of 2 of
    the 65 tokens) at N = 8 and 16, then stride 1 at N = 16: every token of the split counted once, each position's
    loss and the mean loss those of a brute force through the model, one token at a time; the tables and pictures
    written."""
    report, curves = run_tool(monkeypatch, tmp_path / "out", "--data", str(lm_data), "--train-length", "8",
                              "--multipliers", "1", "2", "--stride", "3", "--checkpoint", f"alibi={alibi}")
    assert report["split_tokens"] == 65 and curves["lengths"] == [8, 16]
    for mode in ("nonoverlapping", "sliding"):
        for n in (8, 16):
            assert_same_curve(report, curves, mode, n, alibi, lm_data)
    cell = report["results"]["alibi"]["sliding"]["16"]
    assert cell["context_window"] == 13 and cell["relative"] == pytest.approx(cell["perplexity"]
                                                                              / report["results"]["alibi"]["sliding"]
                                                                              ["8"]["perplexity"])
    assert [(b["first"], b["last"]) for b in cell["position_buckets"]] == [(1, 2), (3, 4), (5, 6), (7, 8), (9, 16)]
    assert sum(b["tokens"] for b in cell["position_buckets"]) == 65
    assert set(report["seconds"]) == {"nonoverlapping", "sliding"} and report["seconds"]["sliding"]["runs"] == 2
    assert report["seconds"]["sliding"]["total"] == pytest.approx(sum(report["seconds"]["sliding"]["by_length"]
                                                                      .values()))
    assert all("curve" not in run for run in report["runs"].values())
    table = (tmp_path / "out" / "lengths.md").read_text()
    assert "| system | N | 1–2 | 3–4 | 5–6 | 7–8 | 9–16 |" in table and "| tokens | 16 | " in table
    assert "Time: " in table and "Perplexity relative to the same checkpoint's at N = 8" in table
    assert "Sliding windows score positions N − 2..N of each window" in table  # no buckets of the first windows
    assert table.count("| system | N | 1–2 |") == 1
    assert (tmp_path / "out" / "positions.png").stat().st_size > 10_000
    assert "w1 [" in (tmp_path / "out" / "logs" / "alibi-1-T16-C13.log").read_text()  # 65 tokens: kept in the log

    report, curves = run_tool(monkeypatch, tmp_path / "stride1", "--data", str(lm_data), "--train-length", "8",
                              "--multipliers", "2", "--stride", "1", "--modes", "sliding",
                              "--checkpoint", f"alibi={alibi}")
    assert report["results"]["alibi"]["sliding"]["16"]["context_window"] == 15
    assert "Perplexity relative" not in (tmp_path / "stride1" / "lengths.md").read_text()  # one length: all 1.000
    from matplotlib.image import imread

    widths = [imread(tmp_path / out / "lengths.png").shape[1] for out in ("out", "stride1")]
    assert widths[1] < widths[0] / 2  # and no relative panel beside the perplexities
    assert_same_curve(report, curves, "sliding", 16, alibi, lm_data)


def test_the_joined_curve_reads_each_position_from_the_shortest_window_reaching_it(lm_data, alibi, tmp_path,
                                                                                       monkeypatch):
    """Its premise first: a causal model scores the first 8 tokens of a 16-token window as the 8-token window that
    starts with them (fairseq's own scores, block b of N = 16 against block 2b of N = 8).  Then the joined curve:
    positions 1-8 from N = 8 (8 tokens each, where N = 16 has 4), 9-16 from N = 16, every token counted once per
    evaluation it comes from.  Catches positions 1-8 read from the longest run, or the runs' slices shifted by one."""
    report, curves = run_tool(monkeypatch, tmp_path / "out", "--data", str(lm_data), "--train-length", "8",
                              "--multipliers", "1", "2", "--modes", "nonoverlapping", "--checkpoint", f"alibi={alibi}")
    logs = tmp_path / "out" / "logs"
    short = dict(positions.word_prob_lines((logs / "alibi-1-T8-C0.log").read_text()))
    long_ = dict(positions.word_prob_lines((logs / "alibi-1-T16-C0.log").read_text()))
    for b, scores in long_.items():
        assert scores[:8] == pytest.approx(short[2 * b][:len(scores[:8])], abs=2e-6), b  # 6 decimals printed
    joined = curves["stitched"]["alibi"]
    one = curves["results"]["alibi"]["nonoverlapping"]
    assert joined["n"] == 16 and joined["from_lengths"] == [8, 16]
    assert joined["count"] == one["8"]["count"] + one["16"]["count"][8:]
    assert joined["loss_base2"] == one["8"]["loss_base2"] + one["16"]["loss_base2"][8:]  # the same runs' values
    assert joined["count"][:8] != one["16"]["count"][:8]  # the long run holds fewer tokens there
    buckets = report["stitched"]["alibi"]["position_buckets"]
    assert [(b["first"], b["last"]) for b in buckets] == [(1, 2), (3, 4), (5, 6), (7, 8), (9, 16)]
    assert [b["tokens"] for b in buckets] == [sum(joined["count"][a - 1:z]) for a, z in ((1, 2), (3, 4), (5, 6), (7, 8),
                                                                                       (9, 16))]
    assert "read from the evaluation at N_k" in (tmp_path / "out" / "lengths.md").read_text()

    # the same evaluation resumed: every run read back from out/runs (none spawned), the same files written
    before = {name: (tmp_path / "out" / name).read_text() for name in ("lengths.md", "positions.json")}
    monkeypatch.setattr(ex, "run_logged", lambda *a, **k: pytest.fail("a recorded run ran again"))
    assert exit_status(ex.main, ["--data", str(lm_data), "--train-length", "8", "--multipliers", "1", "2", "--modes",
                                 "nonoverlapping", "--checkpoint", f"alibi={alibi}", "--out", str(tmp_path / "out"),
                                 "--resume", "--force"]) == 0
    assert {name: (tmp_path / "out" / name).read_text() for name in before} == before


def test_options_that_would_move_the_scores_are_refused(capsys):
    base = ["--checkpoint", "a=b", "--data", "d", "--train-length", "16", "--out", "o"]
    for extra, message in ((["--eval-lm-args", "--post-process subword_nmt"], "--post-process merges sub-words"),
                           (["--eval-lm-args=--add-bos-token"], "--add-bos-token puts a beginning-of-sentence"),
                           (["--eval-lm-args", "--num-workers 2"], "--num-workers 2: sliding windows"),
                           (["--eval-lm-args=--output-word-probs"], "--output-word-probs is set by this tool")):
        with pytest.raises(SystemExit) as e:
            ex.parse_args(base + extra)
        assert e.value.code == 2 and message in capsys.readouterr().err
    assert ex.parse_args(base + ["--eval-lm-args", "--num-workers 2", "--modes", "nonoverlapping"])
    assert ex.parse_args(base + ["--eval-lm-args=--num-workers=1"])


def test_a_curve_that_misses_fairseqs_loss_names_the_point(tmp_path, monkeypatch):
    """A run whose word probabilities do not give its printed loss (here: a score altered) stops the tool with an
    error naming the point."""
    blocks = positions.blocks(20, 16, 0)
    lines = [word_probs_line(b, [(f"w{k}", -1.0) for k in range(size)]) for b, (_, size) in enumerate(blocks)]
    loss = 1.0 / math.log(2)
    output = "\n".join(lines + [f"{PIPE_FORMAT}Evaluated 20 tokens in 0.1s (1.00 tokens/s)",
                                f"{PIPE_FORMAT}Loss (base 2): {loss + 0.01:.4f}, Perplexity: 2.00"])
    monkeypatch.setattr(ex, "run_logged", lambda cmd, log_path, shorten=None: (
        subprocess.CompletedProcess(cmd, 0, output), 0.1))
    args = SimpleNamespace(data="d", gen_subset="test", max_tokens=64, eval_lm_args="", train_length=16)
    with pytest.raises(UserError, match=r"here: the loss by position: the per-token losses give 1\.442695"):
        ex.run_point(args, "ckpt", 16, 0, 20, "log", "here")
    good = output.replace(f"{loss + 0.01:.4f}", f"{loss:.4f}")
    logged = []
    monkeypatch.setattr(ex, "run_logged", lambda cmd, log_path, shorten=None: (
        logged.append((cmd, shorten)) or (subprocess.CompletedProcess(cmd, 0, good), 0.1)))
    run = ex.run_point(args, "ckpt", 16, 0, 20, "log", "here")
    assert run["curve"][1].tolist() == [2] * 4 + [1] * 12
    assert "--output-word-probs" in logged[0][0] and logged[0][1] is None  # 20 tokens: the lines kept in the log
    monkeypatch.setattr(positions, "LOG_WORD_PROBS_UP_TO", 19)
    ex.run_point(args, "ckpt", 16, 0, 20, "log", "here")
    assert logged[1][1] is positions.strip_word_probs
