"""The quickstart command end to end, on the synthetic task and on a real corpus directory."""

import json
import os

import pytest

from fairseq_pe.quickstart import parse_buckets

from helpers import SHARED_DATA, cli

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
              "floater", *SMALL)
    check_results(work, ["ape-learned", "sin-all", "floater"], ["[1,9)", "[9,17)"], [6, 6])
    assert "update 15/15" in out.stdout  # progress was shown
    assert "[9,17) (n=6)" in out.stdout


def test_real_corpus_directory(tmp_path):
    src = os.path.join(SHARED_DATA, "mt", "en-de", "iwslt14", "IWSLT14.TED.tst2010")
    if not os.path.exists(src + ".en"):
        pytest.skip("../shared/data is not available")
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
    hyps = open(os.path.join(work, "systems", "alibi", "generate-test1.txt"), encoding="utf-8").read()
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
