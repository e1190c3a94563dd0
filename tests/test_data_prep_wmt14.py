"""``fairseq-pe-prepare-wmt14`` on a small fake ``--raw-dir`` made of real sentences from ../shared/data
(the end-to-end test, marked shared_data: skipped where that folder is missing).

The fake WMT14 en-de release: Multi30k lines as europarl (extracted files), Tatoeba as commoncrawl
(a .tgz), IWSLT14 lines as news-commentary (bare extracted files), newstest2013 in ``dev.tgz`` and
newstest2014 written as ``.sgm`` (extracted), with pairs that cleaning must drop in the training
corpora and, in the test set, an XML entity and a segment far over 250 words that must be kept.
"""

import html
import os
import re
import tarfile
from collections import Counter

import pytest

from fairseq_pe.data_prep import wmt14
from fairseq_pe.data_prep.wmt14 import PrepError

from helpers import cli, shared_data

SPM = ["--spm-vocab-size", "500", "--workers", "2"]


def lines_of(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


def clean_base(name, n):
    """The first n pairs of ../shared/data/mt/en-de/NAME.{en,de} that no cleaning rule drops."""
    mt = shared_data("mt", "en-de")
    en, de = lines_of(os.path.join(mt, name + ".en")), lines_of(os.path.join(mt, name + ".de"))
    out = []
    for s, t in zip(en, de):
        ns, nt = len(s.split()), len(t.split())
        if 1 <= ns <= 250 and 1 <= nt <= 250 and ns <= 1.5 * nt and nt <= 1.5 * ns:
            out.append((" ".join(s.split()), " ".join(t.split())))
        if len(out) == n:
            return out
    raise AssertionError(name)


def write_pair(prefix, pairs):
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    for i, lang in enumerate(("en", "de")):
        with open(f"{prefix}.{lang}", "w", encoding="utf-8") as f:
            f.writelines(p[i] + "\n" for p in pairs)


def write_sgm(path, segs, kind):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'<{kind}set setid="newstest2014" srclang="any" trglang="de">\n')
        for d in range(0, len(segs), 50):
            f.write(f'<doc sysid="ref" docid="doc{d}" genre="news" origlang="en">\n<p>\n')
            for i, s in enumerate(segs[d:d + 50], d + 1):
                f.write(f'<seg id="{i}">{html.escape(s, quote=False)}</seg>\n')
            f.write("</p>\n</doc>\n")
        f.write(f"</{kind}set>\n")


def make_tgz(path, base, members):
    with tarfile.open(path, "w:gz") as tar:
        for m in members:
            tar.add(os.path.join(base, m), arcname=m)


LONG = " ".join(["word"] * 260), " ".join(["Wort"] * 255)
DIRTY_EUROPARL = [("", "Ein Satz ohne Quelle ."), (" \t ", ""), LONG,
                  ("one two three four five six seven eight", "eins zwei")]  # empty 2, too long 1, ratio 1
DIRTY_CRAWL = [("x" * 1001, "y" * 1001)]  # long word 1


def fake_raw_dir(root):
    raw, stage = root / "raw-in", root / "stage"
    europarl = clean_base("multi30k/train", 300)
    europarl.insert(7, ("A  dog\truns  on the beach .", "Ein Hund  läuft am\tStrand ."))  # kept, normalised
    write_pair(str(raw / "training" / "europarl-v7.de-en"), europarl[:150] + DIRTY_EUROPARL + europarl[150:])
    crawl = clean_base("tatoeba/tatoeba-v2021-08-07", 250)
    write_pair(str(stage / "commoncrawl.de-en"), crawl + DIRTY_CRAWL)
    make_tgz(raw / "training-parallel-commoncrawl.tgz", stage, ["commoncrawl.de-en.en", "commoncrawl.de-en.de"])
    nc = clean_base("iwslt14/IWSLT14.TED.tst2010", 200)
    write_pair(str(raw / "news-commentary-v9.de-en"), nc)  # bare file names directly in --raw-dir
    mt = shared_data("mt", "en-de")
    dev = list(zip(lines_of(os.path.join(mt, "wmt/newstest2013.en"))[:100],
                   lines_of(os.path.join(mt, "wmt/newstest2013.de"))[:100]))
    write_pair(str(stage / "dev" / "newstest2013"), dev)
    write_pair(str(stage / "dev" / "newstest2012"), dev[:3])  # not needed, not extracted
    make_tgz(raw / "dev.tgz", stage, ["dev/newstest2012.en", "dev/newstest2013.en", "dev/newstest2013.de"])
    test = {lang: lines_of(os.path.join(mt, f"wmt/newstest2014.{lang}"))[:120] for lang in ("en", "de")}
    for lang in ("en", "de"):
        test[lang][3] += " R&D <b>"
        test[lang][60] = " ".join(test[lang][:40])  # one segment far over --max-len
    write_sgm(str(raw / "test-full" / "newstest2014-deen-src.en.sgm"), test["en"], "src")
    write_sgm(str(raw / "test-full" / "newstest2014-deen-ref.de.sgm"), test["de"], "ref")
    return raw, {"europarl-v7": len(europarl), "commoncrawl": len(crawl), "news-commentary-v9": len(nc)}, dev, test


@pytest.mark.shared_data
def test_prepare_en_de_end_to_end(tmp_path):
    raw, kept, dev, test = fake_raw_dir(tmp_path)
    work = tmp_path / "work"
    out = cli("fairseq-pe-prepare-wmt14", "--pair", "en-de", "--workdir", str(work), "--raw-dir", str(raw), *SPM)
    log = out.stdout
    # cleaning: the dirty training pairs are dropped, with the counts printed per corpus and reason
    assert (f"europarl-v7: {kept['europarl-v7'] + 4:,} pairs, kept {kept['europarl-v7']:,} "
            f"(dropped: empty 2, too long 1, ratio 1, long word 0)") in log
    assert (f"commoncrawl: {kept['commoncrawl'] + 1:,} pairs, kept {kept['commoncrawl']:,} "
            f"(dropped: empty 0, too long 0, ratio 0, long word 1)") in log
    assert f"news-commentary-v9: {kept['news-commentary-v9']:,} pairs, kept {kept['news-commentary-v9']:,}" in log
    train_en = lines_of(work / "raw" / "train.en")
    assert len(train_en) == len(lines_of(work / "raw" / "train.de")) == sum(kept.values())
    assert "A dog runs on the beach ." in train_en and LONG[0] not in train_en
    assert "Ein Hund läuft am Strand ." in lines_of(work / "raw" / "train.de")
    assert not (work / "orig" / "dev" / "newstest2012.en").exists()  # only the needed members extracted
    # valid and test: every segment, unfiltered, entities unescaped
    assert lines_of(work / "raw" / "valid.en") == [" ".join(s.split()) for s, _ in dev]
    sgm = (raw / "test-full" / "newstest2014-deen-src.en.sgm").read_text(encoding="utf-8")
    n_segs = len(re.findall(r"<seg id=", sgm))
    assert n_segs == 120 and "&amp;" in sgm
    for lang in ("en", "de"):
        got = lines_of(work / "raw" / f"test.{lang}")
        assert len(got) == n_segs
        assert got[60] == " ".join(test[lang][60].split()) and len(got[60].split()) > 250
        assert got[3].endswith(" R&D <b>")
        assert not any("&amp;" in s or "&lt;" in s for s in got)
        assert len(lines_of(work / "spm" / f"test.{lang}")) == n_segs
    assert "test = newstest2014: 120 pairs, all kept" in log
    # sentencepiece and binarised data
    assert (work / "spm" / "spm.model").exists()
    assert lines_of(work / "spm" / "train.en")[0].startswith("▁")
    names = set(os.listdir(work / "data-bin"))
    assert {"dict.en.txt", "dict.de.txt"} <= names
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            assert {f"{split}.en-de.{lang}.bin", f"{split}.en-de.{lang}.idx"} <= names
    assert (work / "data-bin" / "dict.en.txt").read_text() == (work / "data-bin" / "dict.de.txt").read_text()
    assert f"train: {sum(kept.values()):,} pairs" in log and "valid: 100 pairs" in log
    assert "fairseq-train " in log and "--arch transformer_pe_wmt_en_de" in log
    # a re-run skips every step and rewrites nothing
    stamp = os.path.getmtime(work / "data-bin" / "train.en-de.en.bin")
    again = cli("fairseq-pe-prepare-wmt14", "--pair", "en-de", "--workdir", str(work), "--raw-dir", str(raw), *SPM)
    for step in wmt14.STEPS:
        assert f"skip: {step} (done)" in again.stdout
    assert "step " not in again.stdout and "cleaning" not in again.stdout
    assert os.path.getmtime(work / "data-bin" / "train.en-de.en.bin") == stamp


@pytest.mark.parametrize("pair", ["en-de", "en-fr"])
def test_empty_raw_dir_lists_every_missing_file(tmp_path, pair):
    (tmp_path / "raw").mkdir()
    out = cli("fairseq-pe-prepare-wmt14", "--pair", pair, "--workdir", str(tmp_path / "w"),
              "--raw-dir", str(tmp_path / "raw"), check=False)
    assert out.returncode != 0
    tgt = pair[3:]
    expected = ["training-parallel-europarl-v7.tgz", f"training/europarl-v7.{tgt}-en.en",
                f"training/europarl-v7.{tgt}-en.{tgt}", "training-parallel-commoncrawl.tgz",
                f"commoncrawl.{tgt}-en.{tgt}", "training-parallel-nc-v9.tgz",
                f"training/news-commentary-v9.{tgt}-en.en", "dev.tgz", "dev/newstest2013.en",
                f"dev/newstest2013.{tgt}", "test-full.tgz", f"test-full/newstest2014-{tgt}en-src.en.sgm",
                f"test-full/newstest2014-{tgt}en-ref.{tgt}.sgm"]
    if pair == "en-fr":
        expected += ["training-parallel-un.tgz", "un/undoc.2000.fr-en.fr", "training-giga-fren.tar",
                     "giga-fren.release2.fixed.en.gz"]
    for name in expected:
        assert name in out.stderr, name
    assert not (tmp_path / "w" / ".done" / "fetch").exists()


def test_download_failure_names_url_and_raw_dir(tmp_path):
    url = "http://127.0.0.1:9/x.tgz"
    with pytest.raises(PrepError) as e:
        wmt14.download(url, str(tmp_path / "x.tgz"), ["data/x.en", "data/x.de"], timeout=5)
    msg = str(e.value)
    assert url in msg and "--raw-dir" in msg and "x.tgz" in msg and "data/x.en" in msg
    assert os.listdir(tmp_path) == []  # no file, no .part left behind


def test_read_sgm_and_parallel_checks(tmp_path):
    p = tmp_path / "a.sgm"
    p.write_text('<refset>\n<doc docid="1">\n<seg id="1"> A &amp; B  &quot;x&quot; </seg>\n<seg id=2></seg>\n'
                 '<seg id="3">\u2028last</seg></doc>\n', encoding="utf-8")
    assert wmt14.read_sgm(str(p)) == ['A & B "x"', "", "last"]
    p.write_text('<seg id="1">a</seg>\n<seg id="2">b\n<seg id="3">c</seg>\n', encoding="utf-8")
    with pytest.raises(PrepError, match="3 <seg> tags"):
        wmt14.read_sgm(str(p))
    (tmp_path / "x.en").write_text("a\nb\u2028c\nd\n", encoding="utf-8")  # U+2028 is no line break
    (tmp_path / "x.de").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(PrepError, match="has 3 lines but .* has 2"):
        list(wmt14.read_parallel(str(tmp_path / "x.en"), str(tmp_path / "x.de")))


def test_clean_pairs_rules():
    stats = Counter()
    pairs = [("a b", "c d"), ("a", ""), ("a b c", "d e"), ("a b c d", "e f"), ("a " * 6, "b " * 5),
             ("w " * 7, "v " * 7)]
    kept = list(wmt14.clean_pairs(pairs, stats, max_len=6, ratio=1.5))
    assert kept == [("a b", "c d"), ("a b c", "d e"), ("a a a a a a", "b b b b b")]
    assert stats == Counter(pairs=6, kept=3, empty=1, ratio=1, **{"too long": 1})


def test_steps_skip_redo_and_invalidate_later_steps(tmp_path, capsys):
    ran = []

    def go(opt_a=1, opt_b=1):
        steps = wmt14.Steps(str(tmp_path))
        steps.run("a", {"x": opt_a}, lambda: ran.append("a") or "ra")
        steps.run("b", {"y": opt_b}, lambda: ran.append("b") or "rb")

    go()
    go()
    assert ran == ["a", "b"] and "skip: b (done)" in capsys.readouterr().out
    go(opt_a=2)  # a changed: b is redone too
    go(opt_a=2, opt_b=2)  # only b changed
    assert ran == ["a", "b", "a", "b", "b"]


def test_corpora_follow_fairseq_scripts():
    de = {c.name: c for c in wmt14.corpora("en-de")}
    fr = {c.name: c for c in wmt14.corpora("en-fr")}
    assert list(de) == ["europarl-v7", "commoncrawl", "news-commentary-v9", "newstest2013", "newstest2014"]
    assert list(fr) == ["europarl-v7", "commoncrawl", "un", "news-commentary-v9", "giga-fren",
                        "newstest2013", "newstest2014"]
    assert fr["giga-fren"].src == ("giga-fren.release2.fixed.en.gz", "giga-fren.release2.fixed.en")
    assert de["newstest2014"].url == "http://statmt.org/wmt14/test-full.tgz"
    assert all(".en" in c.src[0] and ".fr" in c.tgt[0] for c in fr.values())  # en -> fr


def test_spm_vocab_too_large_names_the_option(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("a small corpus\nwith few pieces\n", encoding="utf-8")
    with pytest.raises(PrepError, match="--spm-vocab-size"):
        wmt14.train_spm([str(text)], str(tmp_path / "spm" / "m"), 5000, 1000, 1)


def test_changed_options_need_force_and_a_foreign_workdir_is_refused(tmp_path, capsys):
    """Issue 14: redoing done steps with other options would replace raw/, spm/ and data-bin/ (which
    trained models depend on): only with --force.  raw/, spm/ or data-bin/ that this tool did not
    write (no WORKDIR/.done) are never used."""
    import json

    work = tmp_path / "w"
    (work / ".done").mkdir(parents=True)
    configs = wmt14.step_configs(wmt14.parse_args(["--pair", "en-de", "--workdir", str(work)]), None)
    for step in ("fetch", "clean"):
        (work / ".done" / step).write_text(json.dumps({"config": configs[step], "result": {}}))
    wmt14.check_workdir(str(work), configs, force=False)  # the same options: resumed
    changed = wmt14.step_configs(wmt14.parse_args(["--pair", "en-de", "--workdir", str(work), "--max-len", "100"]),
                                 None)
    with pytest.raises(PrepError, match=r"clean: max_len 250 there, 100 now\).*pass --force"):
        wmt14.check_workdir(str(work), changed, force=False)
    wmt14.check_workdir(str(work), changed, force=True)

    mine = tmp_path / "mine"
    (mine / "data-bin").mkdir(parents=True)
    try:
        wmt14.main(["--pair", "en-de", "--workdir", str(mine), "--raw-dir", str(tmp_path)])
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "data-bin exist but were not written by fairseq-pe-prepare-wmt14" in err
    assert "Traceback" not in err and os.listdir(mine) == ["data-bin"]
