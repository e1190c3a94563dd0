"""The quickstart command end to end, on the synthetic task and on a real corpus directory."""

import json
import os
import re
import shutil

import pytest

from fairseq_pe.translation.quickstart import parse_buckets

from helpers import cli, shared_data

SMALL = ["--max-update", "15", "--warmup", "5", "--max-tokens", "800", "--beam", "2",
         "--progress-seconds", "0"]


def check_results(workdir, systems, buckets, n_per_bucket):
    with open(os.path.join(workdir, "results.json")) as f:
        res = json.load(f)
    assert res["buckets"] == buckets
    assert list(res["systems"]) == systems
    for name in systems:
        for b, n in zip(buckets, n_per_bucket):
            assert res["systems"][name][b]["n"] == n
            assert 0.0 <= res["systems"][name][b]["bleu"] <= 100.0
        assert res["systems"][name]["all"]["n"] == sum(n_per_bucket)
    with open(os.path.join(workdir, "results.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    table = open(os.path.join(workdir, "results.txt")).read()
    for name in systems:
        assert f"| {name} " in table


def test_synthetic(tmp_path):
    work = str(tmp_path / "qs")
    out = cli("fairseq-pe-quickstart", "--workdir", work, "--train-size", "400", "--test-per-bucket", "6",
              "--buckets", "1,9,17", "--systems", "ape-learned", "sin-all=--pe-absolute sinusoidal --pe-all-blocks",
              "floater", "floater-warm", *SMALL)
    check_results(work, ["ape-learned", "sin-all", "floater", "floater-warm"], ["[1,9)", "[9,17)"], [6, 6])
    # FLOATER's own procedure: 8 sinusoidal updates, the exact conversion, 7 updates of fine-tuning
    warm = os.path.join(work, "systems", "floater-warm", "seed-1")
    assert "num_updates 8" in open(os.path.join(warm, "stage1.log")).read()
    assert "max |log p(original) - log p(FLOATER)|" in open(os.path.join(warm, "warm-start.log")).read()
    train_log = open(os.path.join(warm, "train.log")).read()
    assert re.search(r"Loaded checkpoint \S*warm-start\.pt", train_log) and "num_updates 7" in train_log
    assert not os.path.exists(os.path.join(warm, "stage1")) and not os.path.exists(os.path.join(warm, "warm-start.pt"))
    assert "update 15/15" in out.stdout  # progress was shown
    assert "[9,17) (n=6)" in out.stdout
    # one seed: it says so, and every BLEU has sacreBLEU's bootstrap interval
    assert "ONE training seed (1)" in out.stdout
    res = json.load(open(os.path.join(work, "results.json")))
    for name in res["systems"]:
        for b in ("[1,9)", "[9,17)", "all"):
            assert res["systems"][name][b]["bleu_ci"] >= 0
            assert res["loss"][name][b]["nll"] > 0 and res["loss"][name][b]["n"] == res["systems"][name][b]["n"]
        assert res["loss_per_target_position"][name][0]["position"] == 1
    assert "loss of the references" in out.stdout
    assert open(os.path.join(work, "results-loss.png"), "rb").read(4) == b"\x89PNG"
    assert res["longest_training_target"] <= 17  # 16 words and </s>
    # issue 57: the time of each stage, in the log and the JSON
    seconds = res["seconds"]
    assert {"prepare", "train_and_decode", "score_and_report", "runs"} <= set(seconds)
    assert set(seconds["runs"]) == {f"{name} (seed 1)" for name in ("ape-learned", "sin-all", "floater", "floater-warm")}
    for run in seconds["runs"].values():
        assert run["train"] > 0 and run["decode test"] > 0
    longest = max(run["train"] for run in seconds["runs"].values())
    assert longest <= seconds["train_and_decode"]  # one run's training within the stage that holds it
    assert re.search(r"done in \d+s: preparing \d+s, training and decoding \d+s \(trainings: ape-learned \(seed 1\) "
                     r"\d+s, .*\), scoring and the report \d+s", out.stdout + out.stderr)


def test_seeds_are_trained_apart_and_combined(tmp_path):
    work = str(tmp_path / "qs")
    out = cli("fairseq-pe-quickstart", "--workdir", work, "--train-size", "300", "--test-per-bucket", "4",
              "--buckets", "1,9,17", "--systems", "ape-sinusoidal", "--seeds", "1", "2", *SMALL)
    res = json.load(open(os.path.join(work, "results.json")))
    assert res["seeds"] == [1, 2]
    for seed in (1, 2):
        assert os.path.isfile(os.path.join(work, "systems", "ape-sinusoidal", f"seed-{seed}", "checkpoint_last.pt"))
    per_seed = [res["per_seed"][s]["bleu"]["ape-sinusoidal"]["all"]["bleu"] for s in ("1", "2")]
    combined = res["systems"]["ape-sinusoidal"]["all"]
    assert combined["bleu_seeds"] == per_seed
    assert combined["bleu"] == pytest.approx(sum(per_seed) / 2)
    assert combined["bleu_sd"] == pytest.approx(abs(per_seed[0] - per_seed[1]) / 2 ** 0.5)
    losses = [res["per_seed"][s]["loss"]["ape-sinusoidal"]["all"]["nll"] for s in ("1", "2")]
    assert losses[0] != losses[1], "the two seeds trained the same model"
    assert res["loss"]["ape-sinusoidal"]["all"]["nll"] == pytest.approx(sum(losses) / 2)
    assert "mean ± standard deviation over 2 training seeds (1, 2)" in out.stdout
    assert re.search(r"\| ape-sinusoidal +\| [\d.]+ ± [\d.]+ ", out.stdout)


@pytest.mark.shared_data
def test_real_corpus_directory(tmp_path):
    src = os.path.join(shared_data("mt", "en-de", "iwslt14"), "IWSLT14.TED.tst2010")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = {lang: open(f"{src}.{lang}", encoding="utf-8").read().splitlines() for lang in ("en", "de")}
    ranges = {"train": (0, 600), "valid": (600, 640), "test": (640, 670)}
    for split, (a, b) in ranges.items():
        for lang in ("en", "de"):
            (corpus / f"{split}.{lang}").write_text("\n".join(lines[lang][a:b]) + "\n", encoding="utf-8")
    extra = {lang: tmp_path / f"extra.{lang}" for lang in ("en", "de")}
    for lang in ("en", "de"):
        extra[lang].write_text("\n".join(lines[lang][670:682]) + "\n", encoding="utf-8")
    work = str(tmp_path / "qs")
    out = cli("fairseq-pe-quickstart", "--workdir", work, "--data", str(corpus), "--source-lang", "en",
              "--target-lang", "de", "--spm-vocab-size", "300", "--length-unit", "subword", "--buckets", "1,20+",
              "--extra-test", f"tedx={extra['en']},{extra['de']}", "--systems", "alibi", *SMALL)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(work, "spm", "spm.model"))
    lengths = [len(p) for p in sp.encode(lines["en"][640:670], out_type=str)]
    short = sum(1 for n in lengths if n < 20)
    check_results(work, ["alibi"], ["[1,20)", "[20,inf)"], [short, 30 - short])
    with open(os.path.join(work, "results.json")) as f:
        res = json.load(f)
    assert res["length_unit"] == "sentencepiece tokens"
    assert res["systems"]["alibi"]["tedx"]["n"] == 12  # the extra test corpus, decoded and scored
    assert "tedx (n=12)" in out.stdout
    hyps = open(os.path.join(work, "systems", "alibi", "seed-1", "generate-test1.txt"), encoding="utf-8").read()
    assert sum(1 for line in hyps.splitlines() if line.startswith("D-")) == 12


def test_mismatched_corpus_is_refused(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.en").write_text("a\nb\n")
        (corpus / f"{split}.de").write_text("a\n" if split == "valid" else "a\nb\n")
    out = cli("fairseq-pe-quickstart", "--workdir", str(tmp_path / "w"), "--data", str(corpus),
              "--source-lang", "en", "--target-lang", "de", check=False)
    assert out.returncode != 0
    assert "valid.en has 2 lines but valid.de has 1" in out.stderr


def test_bucket_spec():
    assert parse_buckets("1,20,40+") == [(1, 20), (20, 40), (40, None)]
    with pytest.raises(Exception):
        parse_buckets("5,3")


def error_lines(proc):
    """The ``PROG: error: ...`` lines of a run (with exit status 2 there is exactly one, no traceback)."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return [line for line in proc.stderr.splitlines() if ": error: " in line]


def test_long_references_are_translated_and_long_sources_marked(tmp_path):
    """Issue 14: a learned APE of 20 positions.  Test pairs whose reference is longer than the table
    but whose source fits are translated from the source alone and scored against the whole
    reference; a test set with sources beyond the table gets its column marked n/a with the
    reason, and the system keeps its row and every other column."""
    from fairseq_pe.translation.synthetic import write_corpus

    raw = write_corpus(str(tmp_path / "syn"), train_size=10, valid_size=2, test_buckets=[(3, 8), (25, 30)],
                       test_per_bucket=3, seed=9)
    src = open(os.path.join(raw, "test.src")).read().splitlines()
    tgt = open(os.path.join(raw, "test.tgt")).read().splitlines()
    long_refs = [" ".join([t] * 8) for t in tgt[:3]]
    assert max(len(s.split()) for s in src[:3]) < 19 and min(len(r.split()) for r in long_refs) > 20
    assert sum(len(s.split()) + 1 > 20 for s in src) == 3  # </s> counts: 3 sources do not fit
    files = {}
    for name, sources, refs in (("longref", src[:3], long_refs), ("longsrc", src, tgt)):
        for ext, lines in (("src", sources), ("tgt", refs)):
            files[name, ext] = tmp_path / f"{name}.{ext}"
            files[name, ext].write_text("\n".join(lines) + "\n")
    work = tmp_path / "qs"
    cmd = ["fairseq-pe-quickstart", "--workdir", str(work), "--train-size", "300", "--test-per-bucket", "4",
           "--buckets", "1,9,17", "--systems",
           "small=--pe-absolute learned --max-source-positions 20 --max-target-positions 20", "ape-sinusoidal",
           *[f"--extra-test={n}={files[n, 'src']},{files[n, 'tgt']}" for n in ("longref", "longsrc")], *SMALL]
    out = cli(*cmd)
    res = json.load(open(work / "results.json"))
    small, sin = res["systems"]["small"], res["systems"]["ape-sinusoidal"]
    for label in ("[1,9)", "[9,17)", "all"):  # the in-distribution results are all there
        assert small[label]["n"] == 4 + 4 * (label == "all") and 0 <= small[label]["bleu"] <= 100
    assert small["longref"]["n"] == 3 and 0 <= small["longref"]["bleu"] <= 100  # references longer than the table
    assert small["longsrc"]["bleu"] is None and small["longsrc"]["n"] == 6
    assert small["longsrc"]["na"].startswith("3 of 6 longsrc sources are longer than the 20 source positions")
    assert sin["longsrc"]["n"] == 6 and 0 <= sin["longsrc"]["bleu"] <= 100  # no table: every source translated
    ids = lambda name: [int(line.split("\t")[0][2:]) for line in  # noqa: E731
                        open(work / "systems" / "small" / "seed-1" / name).read().splitlines() if line.startswith("D-")]
    assert sorted(ids("generate-test1.txt")) == [0, 1, 2]
    assert sorted(ids("generate-test2.txt")) == [i for i, s in enumerate(src) if len(s.split()) + 1 <= 20]
    assert re.search(r"^\| small +\| [\d.]+ +\| [\d.]+ +\| [\d.]+ +\| [\d.]+ +\| n/a \[1\] +\|$", out.stdout, re.M)
    assert "[1] small: 3 of 6 longsrc sources are longer than the 20 source positions" in out.stdout
    # the references' loss: the same rule with its own reason (here the long references do not fit the
    # 20-row target table either), and every sentence counted
    loss = res["loss"]["small"]
    assert loss["longsrc"]["nll"] is None and loss["longsrc"]["n"] == 6
    assert loss["longsrc"]["na"].startswith("3 of 6 sentences need more positions than the model has")
    assert loss["longref"]["nll"] is None and "--max-target-positions" in loss["longref"]["na"]
    assert loss["all"]["n"] == 8 and loss["all"]["nll"] > 0
    assert res["loss"]["ape-sinusoidal"]["longref"]["nll"] > 0

    # resumed: nothing is trained or decoded again; other options stop with one line, nothing replaced
    again = cli(*cmd)
    assert ": training (" not in again.stdout and ": decoding " not in again.stdout
    assert json.load(open(work / "results.json"))["systems"] == res["systems"]
    before = open(work / "results.json", "rb").read()
    other = cli(*cmd[:-len(SMALL)], *SMALL[2:], "--max-update", "16", check=False)
    errors = error_lines(other)
    assert other.returncode == 2 and len(errors) == 1, other.stderr[-2000:]
    assert errors[0].startswith("fairseq-pe-quickstart: error: --workdir ")
    assert "system small (seed 1): --max-update 15 there, 16 now" in errors[0] and "pass --force" in errors[0]
    assert open(work / "results.json", "rb").read() == before


def test_a_folder_the_quickstart_did_not_make_is_never_used(tmp_path):
    mine = tmp_path / "mine"
    (mine / "data-bin").mkdir(parents=True)
    (mine / "data-bin" / "dict.en.txt").write_text("a user's data\n")
    for extra in ([], ["--force"]):
        out = cli("fairseq-pe-quickstart", "--workdir", str(mine), "--systems", "none", *extra, check=False)
        errors = error_lines(out)
        assert out.returncode == 2 and len(errors) == 1 and "was not made by fairseq-pe-quickstart" in errors[0]
    assert sorted(p.name for p in mine.rglob("*")) == ["data-bin", "dict.en.txt"]


def test_a_failed_decoding_marks_its_column_and_is_reported():
    from fairseq_pe.translation.quickstart import SystemRun, subset_scores

    run = SystemRun()
    run.outputs["test1"], run.errors["test1"] = None, "decoding failed (fairseq-generate; its log: x.log)"
    failures = []
    res = subset_scores(run, "test1", ["a b", "c"], [0, 0], [(0, None)], failures, "sys", "extra")
    assert res["all"] == {"bleu": None, "n": 2, "ratio": None, "na": run.errors["test1"]}
    assert failures == ["sys/extra: decoding failed (fairseq-generate; its log: x.log)"]


def test_a_work_dir_of_the_version_before_seeds_is_adopted(tmp_path):
    """Before --seeds, a system's one run lived in systems/NAME/ and the corpus seed was "seed": such a
    work dir is reused as it is, its runs moved into systems/NAME/seed-1, nothing trained again."""
    work = tmp_path / "qs"
    cmd = ["fairseq-pe-quickstart", "--workdir", str(work), "--train-size", "200", "--test-per-bucket", "3",
           "--buckets", "1,9,17", "--systems", "ape-sinusoidal", *SMALL]
    cli(*cmd)
    before = json.load(open(work / "results.json"))["systems"]
    system = work / "systems" / "ape-sinusoidal"
    for entry in os.listdir(system / "seed-1"):  # back to the earlier layout and records
        if not entry.startswith("losses-"):
            os.rename(system / "seed-1" / entry, system / entry)
    shutil.rmtree(system / "seed-1")
    for path, key in ((work / "quickstart.json", "data"), (system / "system.json", "config")):
        record = json.load(open(path))
        data = record[key] if key == "data" else record[key]["data"]
        data["seed"] = data.pop("data_seed")
        json.dump(record, open(path, "w"))
    again = cli(*cmd)
    assert ": training (" not in again.stdout and ": decoding " not in again.stdout
    assert "moved into" in again.stdout
    assert os.path.isfile(system / "seed-1" / "checkpoint_last.pt") and not os.path.exists(system / "checkpoint_last.pt")
    assert json.load(open(work / "results.json"))["systems"] == before


def test_a_decode_variant_scores_the_base_checkpoints_with_model_overrides(tmp_path):
    """--decode-variant NAME=BASE:OVERRIDES: no training, the base's checkpoint decoded and its references
    scored under fairseq's --model-overrides (RoPE scaling at inference), a row of its own; changing the
    overrides of a decoded variant needs --force."""
    work = str(tmp_path / "qs")
    pi = "rope-pi=rope:{'pe_rope_scaling': 'linear', 'pe_rope_scaling_factor': 4}"
    cmd = ["fairseq-pe-quickstart", "--workdir", work, "--train-size", "300", "--test-per-bucket", "4",
           "--buckets", "1,9,17", "--systems", "rope", "--decode-variant", pi, *SMALL]
    out = cli(*cmd)
    check_results(work, ["rope", "rope-pi"], ["[1,9)", "[9,17)"], [4, 4])
    base, variant = (os.path.join(work, "systems", n, "seed-1") for n in ("rope", "rope-pi"))
    assert not any(f.endswith(".pt") or f == "train.log" for f in os.listdir(variant))  # nothing trained
    assert "'model_overrides': \"{'pe_rope_scaling': 'linear'" in open(os.path.join(variant, "generate-test.txt")).read()
    losses = [json.load(open(os.path.join(d, "losses-test.json"))) for d in (base, variant)]
    assert len(losses[0]) == len(losses[1]) == 8
    assert any(abs(a - b) > 1e-4 for x, y in zip(*losses) for a, b in zip(x["nll"], y["nll"]))  # positions / 4
    res = json.load(open(os.path.join(work, "results.json")))
    assert res["flags"]["rope-pi"][-2:] == ["--model-overrides",
                                            "{'pe_rope_scaling': 'linear', 'pe_rope_scaling_factor': 4}"]
    assert "1 decoding variant" in out.stdout
    # other overrides for the decoded variant: refused without --force, naming it
    ntk = pi.replace("linear", "ntk")
    again = cli(*[ntk if c == pi else c for c in cmd], check=False)
    assert again.returncode != 0 and "system rope-pi (seed 1)" in again.stderr and "--force" in again.stderr
    bad = cli("fairseq-pe-quickstart", "--workdir", str(tmp_path / "b"), "--systems", "alibi",
              "--decode-variant", pi, check=False)
    assert bad.returncode != 0 and "--decode-variant rope-pi=rope" in bad.stderr and "--systems" in bad.stderr
    bad = cli("fairseq-pe-quickstart", "--workdir", str(tmp_path / "b"), "--decode-variant", "rope-pi=rope:[4]",
              check=False)
    assert bad.returncode != 0 and "OVERRIDES must be a non-empty Python dict" in bad.stderr
