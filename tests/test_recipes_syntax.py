"""The GPU recipes of scripts/recipes/: valid bash, and DRY_RUN=1 prints the commands they would run.

DRY_RUN must work without data, GPUs or any tool but bash and python, so the recipes run here with
a PATH holding only those two, and must leave no file behind.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from fairseq_pe import systems as catalogue

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(REPO, "scripts", "recipes")
FLOATER_RECIPES = ["floater-table2.sh", "floater-figure2-s2l.sh", "floater-table6.sh", "s2l-all-encodings.sh"]


def all_shell_files():
    return sorted(f for f in os.listdir(RECIPES) if f.endswith(".sh"))


@pytest.fixture(scope="module")
def bare_path(tmp_path_factory):
    """A PATH with bash and python only.  ``python`` runs this interpreter by its own path: a symlink to a virtual
    environment's python, run by another path, finds no pyvenv.cfg beside it and starts the base interpreter, without
    this environment's packages (on a machine whose base Python has none of them, Debian's, the recipes' catalogue
    import failed; where the base Python had them, the test passed by that chance)."""
    d = tmp_path_factory.mktemp("bin")
    os.symlink(shutil.which("bash"), d / "bash")
    wrapper = d / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    return str(d)


def dry_run(recipe, tmp_path, bare_path, *args, **env):
    data, out, cwd = tmp_path / "data", tmp_path / "out", tmp_path / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    full_env = {"PATH": bare_path, "HOME": os.environ.get("HOME", str(tmp_path)), "DRY_RUN": "1",
                "DATA_ROOT": str(data), "OUT_ROOT": str(out)}
    full_env.update(env)
    proc = subprocess.run(["bash", os.path.join(RECIPES, recipe), *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{recipe} {args}: exit {proc.returncode}\n{proc.stderr}\n{proc.stdout}"
    assert not data.exists() and not out.exists() and not any(cwd.iterdir()), "DRY_RUN wrote files"
    commands = [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]
    for c in commands:
        shlex.split(c)  # every printed command is valid shell
    return proc.stdout, commands


def train_lines(commands):
    return [c for c in commands if c.startswith("fairseq-train ")]


def flags_of(command):
    """The --pe-* flags of one fairseq-train command, as one string."""
    words = shlex.split(command.split(" 2>&1 | tee")[0])
    pe, i = [], 0
    while i < len(words):
        if words[i].startswith("--pe-"):
            pe.append(words[i])
            if i + 1 < len(words) and not words[i + 1].startswith("--"):
                pe.append(words[i + 1])
                i += 1
        i += 1
    return " ".join(pe)


def save_dir(command):
    return os.path.basename(shlex.split(command.split(" 2>&1 | tee")[0])[-1])


@pytest.mark.parametrize("name", all_shell_files())
def test_bash_syntax(name):
    proc = subprocess.run(["bash", "-n", os.path.join(RECIPES, name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", FLOATER_RECIPES)
def test_header_and_strict_mode(name):
    text = open(os.path.join(RECIPES, name), encoding="utf-8").read()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert "Expected GPU time" in text and "ESTIMATE" in text
    assert "Usage:" in text and "DRY_RUN=1" in text
    assert os.access(os.path.join(RECIPES, name), os.X_OK)


COMMON_TRAIN = ["--user-dir", "--share-all-embeddings", "--adam-betas '(0.9, 0.98)'", "--optimizer adam",
                "--label-smoothing 0.1", "--criterion label_smoothed_cross_entropy",
                "--max-tokens 4096", "--update-freq 8", "--fp16", "--keep-interval-updates 10",
                "--save-interval-updates 2000"]


def test_table2_base_en_de(tmp_path, bare_path):
    out, cmds = dry_run("floater-table2.sh", tmp_path, bare_path)
    assert cmds[0].startswith("fairseq-pe-prepare-wmt14 --pair en-de --workdir ")
    trains = train_lines(cmds)
    runs = {save_dir(c): c for c in trains}
    from_scratch = catalogue.GROUPS["floater-table2"]  # the recipe's systems, and the warm start with its control
    assert set(runs) == {*from_scratch, "floater-ws", "ape-sinusoidal-cont"} and len(from_scratch) == 6
    assert flags_of(runs["ape-sinusoidal"]) == "--pe-absolute sinusoidal"
    assert flags_of(runs["ape-sinusoidal-all"]) == "--pe-absolute sinusoidal --pe-all-blocks"
    assert flags_of(runs["ape-learned-all"]) == "--pe-absolute learned --pe-all-blocks"
    assert flags_of(runs["floater-input"]) == "--pe-absolute floater"
    assert flags_of(runs["floater"]) == "--pe-absolute floater --pe-all-blocks"
    assert flags_of(runs["floater-ws"]) == "--pe-absolute sinusoidal --pe-floater-bias"
    for c in trains:
        assert "--arch transformer_pe_wmt_en_de " in c and "--dropout 0.1 " in c
        for flag in COMMON_TRAIN:
            assert flag in c, (flag, c)
    for name in from_scratch:
        for flag in ("--max-update 100000 ", "--lr 0.0007 ", "--lr-scheduler inverse_sqrt ", "--warmup-updates 4000 ",
                     "--warmup-init-lr 1e-07"):
            assert flag in runs[name], (flag, name)
    # the warm start: convert the sinusoidal model after its training, fine-tune the converted checkpoint
    i_sin = cmds.index(runs["ape-sinusoidal"])
    i_conv = next(i for i, c in enumerate(cmds) if c.startswith("fairseq-pe-warm-start-floater "))
    i_ft = cmds.index(runs["floater-ws"])
    assert i_sin < i_conv < i_ft
    assert "/ape-sinusoidal/checkpoint_last.pt " in cmds[i_conv]
    assert re.search(r"--finetune-from-model \S+/floater-ws/floater_init\.pt ", runs["floater-ws"])
    assert re.search(r"--finetune-from-model \S+/ape-sinusoidal/checkpoint_last\.pt ", runs["ape-sinusoidal-cont"])
    for name in ("floater-ws", "ape-sinusoidal-cont"):
        assert "--max-update 20000 " in runs[name] and "--lr-scheduler fixed" in runs[name]
        assert "--lr 0.00014 " in runs[name]  # 7e-4 · sqrt(4000 / 100000): where the pre-training ended
    # averaging (5 checkpoints for base) and decoding every system, then one score table
    averages = [c for c in cmds if c.startswith("fairseq-pe-average-checkpoints ")]
    assert len(averages) == 8 and all("--num-update-checkpoints 5 " in c for c in averages)
    gens = [c for c in cmds if c.startswith("fairseq-generate ")]
    assert len(gens) == 8
    for c in gens:
        for flag in ("--beam 4 ", "--lenpen 0.6 ", "--required-batch-size-multiple 1 ",
                     "--post-process sentencepiece", "--gen-subset test ", "checkpoint.avg5.pt "):
            assert flag in c, (flag, c)
    bleu = [c for c in cmds if c.startswith("fairseq-pe-bucket-bleu ")]
    assert len(bleu) == 1
    assert bleu[0].count("--system ") == 8 and "--tokenized-bleu de " in bleu[0]
    assert "/wmt14-en-de/raw/test.en " in bleu[0] and "/wmt14-en-de/raw/test.de " in bleu[0]
    # the paper's numbers for this column
    assert "28.6" in out and "27.9" in out and "26.9" in out


@pytest.mark.parametrize("pair,arch,dropout", [("en-de", "transformer_pe_vaswani_wmt_en_de_big", "0.3"),
                                               ("en-fr", "transformer_pe_vaswani_wmt_en_fr_big", "0.1")])
def test_table2_big(tmp_path, bare_path, pair, arch, dropout):
    out, cmds = dry_run("floater-table2.sh", tmp_path, bare_path, pair, "big", NUM_GPUS="8")
    assert cmds[0].startswith(f"fairseq-pe-prepare-wmt14 --pair {pair} ")
    tgt = pair.split("-")[1]
    for c in train_lines(cmds):
        assert f"--arch {arch} " in c and f"--dropout {dropout} " in c and f"--target-lang {tgt} " in c
        assert "--update-freq 1 " in c  # 8 GPUs × 4096 tokens
    assert "--max-update 300000 " in train_lines(cmds)[0] and "--lr 0.0005 " in train_lines(cmds)[0]
    assert all("--num-update-checkpoints 10 " in c for c in cmds if c.startswith("fairseq-pe-average-checkpoints "))
    paper = {("en-de"): "29.2", ("en-fr"): "42.7"}[pair]
    assert paper in out


def test_table2_subset_and_errors(tmp_path, bare_path):
    _, cmds = dry_run("floater-table2.sh", tmp_path, bare_path, SYSTEMS="floater-ws")
    # the warm start needs the sinusoidal model: it is trained, but only floater-ws is decoded
    assert [save_dir(c) for c in train_lines(cmds)] == ["ape-sinusoidal", "floater-ws"]
    assert [c for c in cmds if c.startswith("fairseq-pe-bucket-bleu ")][0].count("--system ") == 1
    for args in (["de-en"], ["en-de", "huge"]):
        proc = subprocess.run(["bash", os.path.join(RECIPES, "floater-table2.sh"), *args], capture_output=True,
                              text=True, env={"PATH": bare_path, "DRY_RUN": "1", "DATA_ROOT": str(tmp_path / "d"),
                                              "OUT_ROOT": str(tmp_path / "o")}, cwd=tmp_path, timeout=60)
        assert proc.returncode != 0 and "error" in proc.stderr


def test_figure2_s2l(tmp_path, bare_path):
    out, cmds = dry_run("floater-figure2-s2l.sh", tmp_path, bare_path)
    data = str(tmp_path / "data")
    assert cmds[0].startswith("fairseq-pe-prepare-wmt14 --pair en-de ")
    split = [c for c in cmds if c.startswith("fairseq-pe-s2l-split ")]
    assert len(split) == 1
    for flag in (f"--corpus {data}/wmt14-en-de/raw/train ", f"--spm-model {data}/wmt14-en-de/spm/spm.model ",
                 "--binarize", "--threshold 80 ", "--bins 80,100,120,140+ ", "--unit subword ",
                 "--source-lang en --target-lang de "):
        assert flag in split[0], flag
    runs = {save_dir(c): c for c in train_lines(cmds)}
    assert set(runs) == {"ape-sinusoidal", "ape-learned", "floater", "floater-ws", "ape-sinusoidal-cont"}
    assert all(f" {data}/s2l-en-de/data-bin " in c for c in runs.values())
    assert any(c.startswith("fairseq-pe-warm-start-floater ") for c in cmds)
    bleu = [c for c in cmds if c.startswith("fairseq-pe-bucket-bleu ")][0]
    assert "--buckets 80,100,120,140+ " in bleu and f"--source {data}/s2l-en-de/test.en " in bleu
    assert bleu.count("--system ") == 5
    assert "/s2l-en-de/base/results/figure2" in bleu
    # the references' loss per bucket, of the same five checkpoints, on the binary test set
    loss = [c for c in cmds if c.startswith("fairseq-pe-bucket-loss ")]
    assert len(loss) == 1 and loss[0].startswith(f"fairseq-pe-bucket-loss {data}/s2l-en-de/data-bin ")
    assert loss[0].count("--system ") == 5 and "--buckets 80,100,120,140+ " in loss[0]
    assert "/floater-ws/checkpoint" in loss[0] and "--unit token " in loss[0]


TABLE6 = {
    "floater": "--pe-absolute floater --pe-all-blocks",
    "rnn1-scalar": "--pe-floater-dynamics rnn --pe-floater-rnn-input scalar --pe-floater-rnn-layers 1",
    "rnn2-scalar": "--pe-floater-dynamics rnn --pe-floater-rnn-input scalar --pe-floater-rnn-layers 2",
    "rnn1-vector": "--pe-floater-dynamics rnn --pe-floater-rnn-input vector --pe-floater-rnn-layers 1",
    "lstm1-scalar": "--pe-floater-dynamics lstm --pe-floater-rnn-input scalar --pe-floater-rnn-layers 1",
    "gru1-scalar": "--pe-floater-dynamics gru --pe-floater-rnn-input scalar --pe-floater-rnn-layers 1",
    "lstm2-scalar": "--pe-floater-dynamics lstm --pe-floater-rnn-input scalar --pe-floater-rnn-layers 2",
    "gru2-scalar": "--pe-floater-dynamics gru --pe-floater-rnn-input scalar --pe-floater-rnn-layers 2",
}


def test_table6(tmp_path, bare_path):
    out, cmds = dry_run("floater-table6.sh", tmp_path, bare_path)
    runs = {save_dir(c): c for c in train_lines(cmds)}
    assert set(runs) == set(TABLE6)
    for name, flags in TABLE6.items():
        expected = "--pe-absolute floater --pe-all-blocks" + ("" if name == "floater" else " " + flags)
        assert flags_of(runs[name]) == expected, name
        assert "--arch transformer_pe_wmt_en_de " in runs[name] and "/wmt14-en-de/base/" in runs[name]
    bleu = [c for c in cmds if c.startswith("fairseq-pe-bucket-bleu ")][0]
    assert bleu.count("--system ") == 8
    for value in ("28.57", "526.3K", "26.21", "1580.0K"):
        assert value in open(os.path.join(RECIPES, "floater-table6.sh"), encoding="utf-8").read()


S2L_ALL = {
    "none": "--pe-absolute none",
    "ape-learned": "--pe-absolute learned",
    "ape-sinusoidal": "--pe-absolute sinusoidal",
    "ape-learnable-sin": "--pe-absolute learnable-sinusoidal",
    "rpe-learned": "--pe-absolute none --pe-relative learned",
    "rpe-sinusoidal": "--pe-absolute none --pe-relative sinusoidal",
    "rpe-learnable-sin": "--pe-absolute none --pe-relative learnable-sinusoidal",
    "ape+rpe-learnable-sin": "--pe-absolute learnable-sinusoidal --pe-relative learnable-sinusoidal",
    "rope": "--pe-absolute none --pe-relative rope",
    "alibi": "--pe-absolute none --pe-relative alibi",
    "t5": "--pe-absolute none --pe-relative t5",
    "floater": "--pe-absolute floater --pe-all-blocks",
    "floater-bias": "--pe-absolute sinusoidal --pe-floater-bias",
    "floater-ws": "--pe-absolute sinusoidal --pe-floater-bias",
    "ape-sinusoidal-cont": "--pe-absolute sinusoidal",
}


def test_s2l_all_encodings(tmp_path, bare_path):
    out, cmds = dry_run("s2l-all-encodings.sh", tmp_path, bare_path)
    runs = {save_dir(c): c for c in train_lines(cmds)}
    assert set(runs) == set(S2L_ALL)
    for name, flags in S2L_ALL.items():
        assert flags_of(runs[name]) == flags, name
    bleu = [c for c in cmds if c.startswith("fairseq-pe-bucket-bleu ")][0]
    systems = re.findall(r"--system (\S+?)=", bleu)
    assert systems == list(S2L_ALL)
    assert "--buckets 80,100,120,140+ " in bleu and "/s2l-en-de/base/results/s2l-all" in bleu


def test_shared_runs_have_the_same_flags(tmp_path, bare_path):
    """A run directory used by two recipes must be trained with the same flags by both."""
    seen = {}
    for recipe in FLOATER_RECIPES:
        _, cmds = dry_run(recipe, tmp_path / recipe, bare_path)
        for c in train_lines(cmds):
            d = shlex.split(c.split(" 2>&1 | tee")[0])[-1]
            d = d.split(str(tmp_path / recipe / "out"))[-1]
            without_paths = re.sub(r"\S*/(data|out)/\S*", "PATH", c)
            assert seen.setdefault(d, without_paths) == without_paths, (recipe, d)
    assert "/wmt14-en-de/base/floater" in seen and "/s2l-en-de/base/ape-sinusoidal" in seen


# --------------------------------------------------------------------------------------------
# BERT recipes (issue 6): Wang et al.'s schedule and the CPU-scale comparison


def _value(command, flag):
    words = shlex.split(command)
    return words[words.index(flag) + 1] if flag in words else None


@pytest.mark.parametrize("mode", ["medium", "base"])
def test_bert_pretrain_recipe_follows_table_4(tmp_path, bare_path, mode):
    _, commands = dry_run("bert-pretrain.sh", tmp_path, bare_path, "/data/text-bin", mode, NUM_GPUS="8")
    mlm = [c for c in train_lines(commands) if "--task masked_lm" in c]
    p128 = [c for c in mlm if "--tokens-per-sample 128" in c]
    p512 = [c for c in mlm if "--tokens-per-sample 512" in c and "/p512" in c]
    assert len(p128) == len(p512) == 9  # every system: 128 then 512
    for c in mlm:
        assert _value(c, "--max-positions") == "512" and _value(c, "--lr") == "5e-5"
    for c in p512:
        assert _value(c, "--restore-file").endswith("/p128/checkpoint_last.pt")
        # batch 512 = 32 per GPU x 8 GPUs x update-freq 2
        assert _value(c, "--update-freq") == "2" and _value(c, "--max-epoch") == "2"
    batch_128 = {"medium": "1", "base": "1"}[mode]  # 128 / (32 x 8) and 64 / (32 x 8) round up to 1
    assert all(_value(c, "--update-freq") == batch_128 for c in p128)
    assert {_value(c, "--max-epoch") for c in p128} == {"10" if mode == "medium" else "5"}
    assert {_value(c, "--arch") for c in mlm} == {"roberta_pe_medium" if mode == "medium" else "roberta_pe_base"}
    glue = [c for c in train_lines(commands) if "sentence_prediction" in c]
    squad = [c for c in train_lines(commands) if "--task span_prediction" in c]
    assert len(glue) == 9 * 5 and len(squad) == 9
    assert all(_value(c, "--lr") == "2e-5" and _value(c, "--max-epoch") == "3" for c in glue)
    assert all(_value(c, "--lr") == "3e-5" for c in squad)
    prep = [c for c in commands if c.startswith("fairseq-pe-prepare-squad")]
    assert _value(prep[0], "--max-length") == "384"
    if mode == "base":
        warm = [c for c in commands if c.startswith("fairseq-pe-warm-start-roberta")]
        assert len(warm) == 9
        dyn = [c for c in mlm if "--pe-floater-freeze-body" in c]
        assert len(dyn) == 1 and "--pe-floater-bias" in dyn[0]


def test_bert_cpu_recipe_gives_every_encoding_the_same_budget(tmp_path, bare_path):
    _, commands = dry_run("bert-cpu.sh", tmp_path, bare_path, OUT=str(tmp_path / "out"), SEEDS="1 2",
                          EXTRA_SYSTEMS="ape-sin-1 --pe-absolute sinusoidal --pe-sinusoid-scale 1")
    trains = train_lines(commands)
    for task in ("masked_lm", "sentence_prediction", "span_prediction"):
        runs = [c for c in trains if f"--task {task}" in c]
        assert len(runs) == 12, task  # 6 encodings x 2 seeds, each seed in its own folder
        for seed in ("1", "2"):
            budget = {(_value(c, "--max-update"), _value(c, "--batch-size"), _value(c, "--lr"))
                      for c in runs if _value(c, "--seed") == seed}
            assert len(budget) == 1, budget
            assert all(_value(c, "--save-dir").endswith(f"-s{seed}") for c in runs if _value(c, "--seed") == seed)
        assert {flags_of(c) for c in runs} == {
            "--pe-absolute learned", "--pe-absolute sinusoidal", "--pe-absolute learnable-sinusoidal",
            "--pe-absolute none --pe-relative learned", "--pe-absolute floater --pe-all-blocks",
            "--pe-absolute sinusoidal --pe-sinusoid-scale 1"}
    table = [c for c in commands if "bert_cpu_table.py" in c][0]
    assert table.rstrip().endswith("--seeds 1 2")
    assert "ape-sin-1=--pe-absolute\\ sinusoidal\\ --pe-sinusoid-scale\\ 1" in table  # printf %q
    assert all("--tokens-per-sample 128" in c and "--max-positions 512" in c for c in trains if "masked_lm" in c)


def test_bert_cpu_recipe_finetune_picks_the_finetunings(tmp_path, bare_path):
    _, commands = dry_run("bert-cpu.sh", tmp_path, bare_path, OUT=str(tmp_path / "out"), FINETUNE="sst2",
                          SYSTEMS="ape-sin")
    tasks = [_value(c, "--task") for c in train_lines(commands)]
    assert tasks == ["masked_lm", "sentence_prediction"]
    assert not any(c.startswith("fairseq-pe-squad-predict") for c in commands)
    proc = subprocess.run(["bash", os.path.join(RECIPES, "bert-cpu.sh")], env={"PATH": bare_path, "DRY_RUN": "1",
                          "FINETUNE": "sst2 glue"}, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown fine-tuning 'glue' in FINETUNE" in proc.stderr


def test_captions_recipe_decodes_the_randomised_systems_with_spaced_positions_too(tmp_path):
    """s2l-cpu-captions.sh hands fairseq-pe-quickstart a *-spaced decoding (--pe-random-eval-decoder spaced through
    --model-overrides, no retraining) of each randomised system it trains, beside RoPE's scalings, Resonance RoPE
    and ReRoPE."""
    corpus, work, bin_dir = tmp_path / "corpus", tmp_path / "work", tmp_path / "bin"
    for d in (corpus, work / "split", bin_dir):
        d.mkdir(parents=True)
    (work / "split" / "stats.json").write_text("{}")  # the split is reused
    quickstart = bin_dir / "fairseq-pe-quickstart"
    quickstart.write_text("#!/bin/bash\nprintf '%s\\n' \"$@\"\n")
    quickstart.chmod(0o755)
    for tool in ("bash", "dirname"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    env = {"PATH": str(bin_dir), "CORPUS_DIRS": str(corpus), "SYSTEMS": "rope rope-random ape-sinusoidal-random"}
    proc = subprocess.run(["bash", os.path.join(RECIPES, "s2l-cpu-captions.sh"), str(work)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.splitlines()
    variants = [words[i + 1] for i, w in enumerate(words) if w == "--decode-variant"]
    assert variants[6:] == ["ape-sinusoidal-random-spaced=ape-sinusoidal-random:{'pe_random_eval_decoder': 'spaced'}",
                            "rope-random-spaced=rope-random:{'pe_random_eval_decoder': 'spaced'}"]
    assert [v.split("=")[0] for v in variants[:6]] == ["rope-pi", "rope-ntk", "rope-yarn", "rope-yarn-resonance",
                                                       "rope-rerope", "rope-leaky-rerope"]
    assert words[words.index("--systems") + 1:words.index("--systems") + 4] == ["rope", "rope-random",
                                                                              "ape-sinusoidal-random"]
