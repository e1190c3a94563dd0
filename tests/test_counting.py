"""CoPE's counting task: the programs of ``fairseq-pe-counting data`` (fairseq_pe/lm/counting.py), the answer-only
loss ``--criterion answer_cross_entropy`` (fairseq_pe/criterions/answer_cross_entropy.py), the scoring through
fairseq-validate, and the recipe scripts/recipes/lm-cpu-counting.sh."""

import json
import os
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary

from fairseq_pe import systems as catalogue
from fairseq_pe.criterions.answer_cross_entropy import AnswerCrossEntropyCriterion, answer_positions
from fairseq_pe.lm import counting

from helpers import ALL_ENCODINGS, PLUGIN, REPO, cli, dictionary, forked, optimizer_gradients, torchrun, dry_run

RECIPE = os.path.join(REPO, "scripts", "recipes", "lm-cpu-counting.sh")


def test_programs_answer_what_they_compute():
    """Every answer is the value its program gives the variable asked (an interpreter of the text, written apart
    from the generator); the statements' mix and the values' bound are the reference's; a seed gives one program."""
    rng = random.Random(5)
    kinds = {"set": 0, "pass": 0, "increment": 0}
    for steps in (3, 17, 64, 256):
        for _ in range(200):
            text, answer, value = counting.program(rng, 3, steps)
            words = text.split()
            assert words[-2] == "print" and words[-1] in "abc" and answer == str(value)
            assert counting.evaluate(f"{text} {answer}") == value and 0 <= value <= counting.MAX_VALUE
            n = text.count("pass;") + text.count("++;") + text.count("= 0 ;")
            assert n == steps  # every statement drawn applied
            kinds["pass"] += text.count("pass;")
            kinds["increment"] += text.count("++;")
            kinds["set"] += text.count("= 0 ;")
    # weights 50 : 7 : 1 (a redrawn increment moves a little mass to the others)
    total = sum(kinds.values())
    assert 0.80 < kinds["pass"] / total < 0.90 and 0.08 < kinds["increment"] / total < 0.13
    assert counting.program(random.Random(1), 3, 40) == counting.program(random.Random(1), 3, 40)
    one = counting.program(random.Random(2), 1, 30)[0].split()  # --nvars 1: the variable a only
    assert {w for w in one if w in counting.VARIABLES} == {"a"}


def test_split_lengths_are_disjoint_past_the_training_range():
    ranges = counting.split_ranges(64, [1, 2, 4])
    assert ranges == {"train": (3, 64), "valid": (3, 64), "test-1x": (3, 64), "test-2x": (65, 128),
                      "test-4x": (129, 256)}
    # the -small twins come after, so the splits before them are drawn from the same seeds with or without them
    assert list(counting.split_ranges(64, [1, 2, 4], 4)) == list(ranges) + [
        "test-1x-small", "test-2x-small", "test-4x-small"]


def test_the_plot_puts_each_group_of_tests_in_its_panel():
    assert counting.plot_panels(["1x", "2x", "4x", "1x-small", "2x-small", "4x-small"]) == {
        "all answers": ["1x", "2x", "4x"], "small": ["1x-small", "2x-small", "4x-small"]}
    assert counting.plot_panels(["short", "long"]) == {"all answers": ["short", "long"]}


def test_data_refuses_to_overwrite(tmp_path, capsys):
    argv = ["data", "--out", str(tmp_path), "--train", "20", "--valid", "5", "--test", "5", "--max-steps", "8"]
    counting.main(argv)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["splits"]["test-4x"]["statements"] == [17, 32] and stats["splits"]["train"]["samples"] == 20
    for line in (tmp_path / "test-4x.txt").read_text().splitlines():
        assert counting.evaluate(line) == int(line.split()[-1])
    small = (tmp_path / "test-4x-small.txt").read_text().splitlines()
    assert len(small) == 5 and all(counting.evaluate(line) == int(line.split()[-1]) <= 4 for line in small)
    assert all(17 <= line.count(";") <= 32 for line in small)  # test-4x's lengths (one ";" a statement)
    without = tmp_path / "without"
    counting.main(argv[:2] + [str(without)] + argv[3:] + ["--small-answers", "-1"])
    assert (without / "test-4x.txt").read_text() == (tmp_path / "test-4x.txt").read_text()
    assert not (without / "test-4x-small.txt").exists()
    with pytest.raises(SystemExit) as e:
        counting.main(argv)
    assert e.value.code == 2 and "--force" in capsys.readouterr().err


class _Logits(torch.nn.Module):
    """A stand-in language model: fixed logits (B, T, V)."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, src_tokens, src_lengths=None):
        return self.logits, None

    def get_normalized_probs(self, net_output, log_probs):
        return F.log_softmax(net_output[0].float(), dim=-1)


def test_the_loss_and_accuracy_are_the_answers_only():
    """The answer is the token before </s> (padding after it): the loss is the negative log-likelihood of those
    tokens only, the accuracy their argmax's; with --answer-tokens 2 a sample is right when both are."""
    d = Dictionary()
    for w in "abcdefgh":
        d.add_symbol(w)
    eos, pad = d.eos(), d.pad()
    target = torch.tensor([[5, 6, 7, eos, pad], [8, 9, 10, 11, eos]])
    assert answer_positions(target, eos, 1).tolist() == [[0, 0, 1, 0, 0], [0, 0, 0, 1, 0]]
    assert answer_positions(target, eos, 2).tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0]]
    torch.manual_seed(0)
    logits = torch.randn(2, 5, len(d))
    logits[0, 2, 7] = 20.0  # sample 0's answer right, sample 1's wrong
    logits[1, 3, 11] = -20.0
    task = SimpleNamespace(target_dictionary=d)
    sample = {"net_input": {"src_tokens": target}, "target": target, "ntokens": 9}
    lprobs = F.log_softmax(logits, dim=-1)
    loss, size, out = AnswerCrossEntropyCriterion(task, 1)(_Logits(logits), sample)
    assert size == 2 and torch.allclose(loss, -(lprobs[0, 2, 7] + lprobs[1, 3, 11]))
    assert int(out["answer_correct"]) == 1 and int(out["answer_samples"]) == 2
    logits[1, 3, 11] = 20.0
    logits[1, 2, 10] = 20.0
    loss2, size2, out2 = AnswerCrossEntropyCriterion(task, 2)(_Logits(logits), sample)
    assert size2 == 4 and int(out2["answer_correct"]) == 1  # sample 0's token 6 is not its argmax
    with pytest.raises(ValueError, match="--answer-tokens 0"):
        AnswerCrossEntropyCriterion(task, 0)
    # no host sync in a training step's loss, forward and backward (stock cross_entropy makes none either)
    from fairseq_pe.diagnostics.op_count import counting as count_ops

    leaf = logits.clone().requires_grad_()
    with count_ops() as ops:
        loss3, _, _ = AnswerCrossEntropyCriterion(task, 1)(_Logits(leaf), sample)
        loss3.backward()
    assert not ops.sync_calls and not ops.host_reads, (ops.sync_calls, ops.host_reads)
    assert leaf.grad[0, :2].abs().sum() == 0 and leaf.grad[0, 2].abs().sum() > 0  # the context has no loss


@pytest.mark.parametrize("name", ["cope", "rope", "fox"])
def test_the_answer_loss_trains_in_half_precision_through_fairseqs_optimizers(name, tmp_path, cpu_fp16_optimizer):
    """One update of fairseq's trainer with ``--criterion answer_cross_entropy`` in each precision (its FP16Optimizer,
    bf16 form, MemoryEfficientFP16Optimizer): no update skipped, every sample's answer counted, and the loss and the
    gradients are float32's within the language models' tolerances (tests/test_lm.py)."""
    from test_lm import TRAINER_TOLERANCE, lm_sample, lm_trainers

    dictionary(40).save(str(tmp_path / "dict.txt"))
    precisions = ["fp32", "fp16", "bf16", "memory-efficient-fp16"]
    trainers = lm_trainers(tmp_path, [*ALL_ENCODINGS[name], "--criterion", "answer_cross_entropy"], precisions)
    d = trainers["fp32"].task.source_dictionary
    sample = lm_sample(d)
    sample["target"][:, -1] = d.eos()  # each line ends "... ANSWER </s>": the answer is the token before </s>
    results = {}
    for precision, trainer in trainers.items():
        log = trainer.train_step([sample])
        assert log is not None and trainer.get_num_updates() == 1, f"{precision}: the update was skipped"
        assert log["answers"] == len(sample["target"]), precision
        params = [p for _, p in sorted(trainer.model.named_parameters()) if p.requires_grad]
        grads = torch.cat([g.flatten() for g in optimizer_gradients(trainer.optimizer, params) if g is not None])
        results[precision] = (log["loss"], grads)
    loss, grads = results["fp32"]
    assert grads.norm() > 0
    for precision in precisions[1:]:
        half_loss, half_grads = results[precision]
        assert half_loss == pytest.approx(loss, rel=2e-2), precision
        deviation = float((half_grads - grads).norm() / grads.norm())
        assert deviation <= TRAINER_TOLERANCE[precision], (precision, deviation)


VALIDATE = ("2026-01-01 | INFO | valid | valid on 'test' subset | loss 0.402 | answers 1000 | answers_correct 891 | "
            "accuracy 89.1 | wps 0 | wpb 44141 | bsz 1000\n"
            "2026-01-01 | INFO | valid | valid on 'test1' subset | loss 2.072 | answers 1000 | answers_correct 510 | "
            "accuracy 51 | wps 0 | wpb 113932 | bsz 1000\n")


def test_validate_output_is_read_strictly():
    parsed = counting.parse_validate(VALIDATE)
    assert parsed == {"test": {"loss": 0.402, "accuracy": 89.1, "answers": 1000},
                      "test1": {"loss": 2.072, "accuracy": 51.0, "answers": 1000}}
    with pytest.raises(ValueError, match="answer_cross_entropy"):  # a checkpoint trained with another criterion
        counting.parse_validate("valid on 'test' subset | loss 3.2 | ppl 9.1 | wps 0\n")


def _train(data, save_dir, seed, *flags, command=("fairseq-train",)):
    return cli(*command, data, "--user-dir", PLUGIN, "--task", "language_modeling", "--tokens-per-sample", "128",
        "--sample-break-mode", "eos", "--criterion", "answer_cross_entropy", "--arch", "transformer_lm_pe_tiny",
        *flags, "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "512", "--max-update", "4", "--seed",
        str(seed), "--cpu", "--num-workers", "0", "--save-dir", save_dir, "--no-epoch-checkpoints",
        "--disable-validation")


def test_counting_tool_end_to_end(tmp_path):
    """Programs written, binarised and learned by CoPE with the answer-only loss (two seeds, from the fork server);
    fairseq-pe-counting score reads every answer of each split through fairseq-validate: the table's mean is the
    seeds' mean, each seed's accuracy is a whole number of answers; a model trained on the whole line is refused by
    the criterion's name."""
    raw, data = tmp_path / "raw", tmp_path / "data"
    cli("fairseq-pe-counting", "data", "--out", raw, "--train", "200", "--valid", "20", "--test", "30",
        "--max-steps", "8", "--length-factors", "1", "2")
    with forked():
        cli("fairseq-preprocess", "--only-source", "--trainpref", raw / "train.txt", "--validpref", raw / "valid.txt",
            "--testpref", f"{raw / 'test-1x.txt'},{raw / 'test-2x.txt'}", "--destdir", data, "--workers", "1")
        for s in (1, 2):
            _train(data, tmp_path / f"cope-{s}", s, *catalogue.flags("cope"))
        cope = [os.path.join(tmp_path / f"cope-{s}", "checkpoint_last.pt") for s in (1, 2)]
        whole = os.path.join(tmp_path / "whole", "checkpoint_last.pt")
        cli("fairseq-train", data, "--user-dir", PLUGIN, "--task", "language_modeling", "--tokens-per-sample", "128",
            "--sample-break-mode", "eos", "--arch", "transformer_lm_pe_tiny", "--optimizer", "adam", "--lr", "0.002",
            "--max-tokens", "512", "--max-update", "2", "--cpu", "--save-dir", tmp_path / "whole",
            "--no-epoch-checkpoints", "--disable-validation")
    out = tmp_path / "score"
    cli("fairseq-pe-counting", "score", "--data", data, "--checkpoint", *[f"cope={c}" for c in cope],
        "--subsets", "1x=test", "2x=test1", "--validate-args=--cpu", "--out", out)
    report = json.loads((out / "counting.json").read_text())
    cells = report["results"]["cope"]
    assert list(report["subsets"]) == ["1x", "2x"] and report["checkpoints"]["cope"] == cope
    for label in ("1x", "2x"):
        seeds = cells[label]["accuracy_seeds"]
        assert len(seeds) == 2 and cells[label]["answers"] == 30
        assert all(abs(a * 30 / 100 - round(a * 30 / 100)) < 1e-6 for a in seeds)
        assert cells[label]["accuracy"] == pytest.approx(sum(seeds) / 2)
    table = (out / "counting.md").read_text()
    assert "| cope | " in table and "Every seed" in table and (out / "counting.png").stat().st_size > 5_000
    with forked():
        bad = cli("fairseq-pe-counting", "score", "--data", data, "--checkpoint", f"whole={whole}", "--subsets",
                  "1x=test", "--validate-args=--cpu", "--out", tmp_path / "score2", check=False)
    assert bad.returncode == 2 and "answer_cross_entropy" in bad.stderr
    again = cli("fairseq-pe-counting", "score", "--data", data, "--checkpoint", f"cope={cope[0]}", "--subsets",
                "1x=test", "--out", out, check=False)  # the earlier result is kept
    assert again.returncode == 2 and "--force" in again.stderr
    # two processes (gloo): the answer counts of both ranks are summed, every update (each line has one answer)
    two = _train(data, tmp_path / "ddp", 1, *catalogue.flags("cope"), "--distributed-backend", "gloo", "--log-format",
                 "json", "--log-interval", "1", command=torchrun("fairseq-train"))
    log = two.stdout + two.stderr
    updates = [json.loads(line.split("| train_inner | ", 1)[1]) for line in log.splitlines()
               if "| train_inner |" in line]
    assert "distributed init (rank 1)" in log and len(updates) == 4, log[-3000:]
    for update in updates:
        assert float(update["answers"]) == float(update["bsz"]) > 0 and 0 <= float(update["accuracy"]) <= 100


def test_recipe_commands_and_bad_systems(tmp_path):
    """DRY_RUN=1: the catalogue's lm-cpu-counting systems, one training per system and seed with the answer-only
    loss on whole programs, read by fairseq's own parser with the plugin; scoring on the three test splits."""
    from fairseq import options

    proc, commands = dry_run(RECIPE, tmp_path)
    assert proc.returncode == 0, proc.stderr
    trains = [c for c in commands if c[0] == "fairseq-train"]
    group = catalogue.group("lm-cpu-counting")
    assert len(trains) == 3 * len(group) == 21
    for c, (name, flags) in zip(trains, group.items()):
        assert " ".join(flags) in " ".join(c) and c[c.index("--seed") + 1] == "1"
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, c[1:])
        assert args.criterion == "answer_cross_entropy" and args.sample_break_mode == "eos"
        assert args.tokens_per_sample == 64 * 16 + 3 and args.max_update == 3000
    score = next(c for c in commands if c[:2] == ["fairseq-pe-counting", "score"])
    assert score[score.index("--subsets") + 1:score.index("--subsets") + 7] == [
        "1x=test", "2x=test1", "4x=test2", "1x-small=test3", "2x-small=test4", "4x-small=test5"]
    preprocess = next(c for c in commands if c[0] == "fairseq-preprocess")
    assert [os.path.basename(p) for p in preprocess[preprocess.index("--testpref") + 1].split(",")] == [
        "test-1x.txt", "test-2x.txt", "test-4x.txt", "test-1x-small.txt", "test-2x-small.txt", "test-4x-small.txt"]
    assert not (tmp_path / "work").exists()
    bad, _ = dry_run(RECIPE, tmp_path, SYSTEMS="cope nosuch")
    assert bad.returncode == 2 and "SYSTEMS: unknown system 'nosuch'" in bad.stderr


def test_recipe_smoke_and_resume(tmp_path):
    """A real run of a few updates: the programs, their binarisation, a training whose positions reach the longest
    test program, the scoring of every test answer; a re-run trains and scores nothing again."""
    work = tmp_path / "work"
    env = dict(TRAIN="100", MAX_STEPS="6", MAX_UPDATE="3", WARMUP="2", MAX_TOKENS="512", SYSTEMS="rope", SEEDS="1",
               JOBS="1")
    command = ["env", *[f"{k}={v}" for k, v in env.items()], "bash", RECIPE, str(work)]
    out = cli(*command)
    report = json.loads((work / "score" / "counting.json").read_text())
    stats = json.loads((work / "raw" / "stats.json").read_text())
    assert list(report["subsets"]) == ["1x", "2x", "4x", "1x-small", "2x-small", "4x-small"]
    assert list(report["results"]) == ["rope"]
    assert all(cell["answers"] == 1000 for cell in report["results"]["rope"].values())
    longest = max(s["tokens_max"] for s in stats["splits"].values())
    assert f"'tokens_per_sample': {longest}," in (work / "runs" / "rope-s1" / "train.log").read_text()
    assert "| rope |" in out.stdout
    stamp = os.stat(work / "score" / "counting.json").st_mtime_ns
    again = cli(*command)
    assert "rope seed 1: trained already" in again.stderr and "scored already" in again.stderr
    assert os.stat(work / "score" / "counting.json").st_mtime_ns == stamp
