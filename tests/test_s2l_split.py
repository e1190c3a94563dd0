"""The short-to-long split: bins and boundaries, statistics, held-back sets, the empty-bin refusal, the CLI."""

import json
import os

import pytest

from fairseq_pe.translation.bleu import parse_buckets
from fairseq_pe.translation.s2l import s2l_split

from helpers import cli, shared_data

BINS = parse_buckets("80,100,120,140+")


def sentence(n, tag):
    return " ".join(f"{tag}{k}" for k in range(n))


def fixture_corpus():
    """Lengths chosen on every boundary: 79 is short, 80/99 the first bin, 100, 119/120, 139/140, 400."""
    long_lengths = [80, 99, 100, 119, 120, 139, 140, 400]
    short_lengths = list(range(1, 80)) * 2  # 158 short pairs
    lengths = short_lengths[:60] + long_lengths[:4] + short_lengths[60:] + long_lengths[4:]
    sources = [sentence(n, f"s{i}_") for i, n in enumerate(lengths)]
    return sources, lengths


def test_bins_boundaries_and_statistics():
    sources, lengths = fixture_corpus()
    split = s2l_split(sources, lengths, 80, BINS, valid_size=10, short_test_size=5, seed=3)
    assert [lengths[i] for i in split.test] == [80, 99, 100, 119, 120, 139, 140, 400]  # input order kept
    assert [BINS[b] for b in split.test_bins] == [(80, 100), (80, 100), (100, 120), (100, 120),
                                                 (120, 140), (120, 140), (140, None), (140, None)]
    assert all(lengths[i] < 80 for i in split.train + split.valid + split.test_short)
    assert max(lengths[i] for i in split.train) == 79
    parts = [set(split.train), set(split.valid), set(split.test_short), set(split.test)]
    assert sum(len(p) for p in parts) == len(set().union(*parts)) == len(sources)  # disjoint, nothing lost
    assert (len(split.valid), len(split.test_short)) == (10, 5)
    s = split.stats
    assert s["short_pairs"] == 158 and s["long_pairs"] == 8
    assert s["share_short_percent"] == pytest.approx(100 * 158 / 166, abs=0.01)
    assert s["test_bins"] == {"[80,100)": 2, "[100,120)": 2, "[120,140)": 2, "[140,inf)": 2}
    assert s["train"] == 158 - 15


def test_held_back_sources_are_removed_from_training():
    sources = ["a b"] * 5 + [f"x{i}" for i in range(50)] + [sentence(90, "l")]
    lengths = [len(x.split()) for x in sources]
    split = s2l_split(sources, lengths, 80, parse_buckets("80+"), valid_size=20, seed=0)
    held = {sources[i] for i in split.valid}
    assert not held & {sources[i] for i in split.train}
    assert split.stats["train_pairs_removed_as_duplicates_of_held_back_sources"] == \
        55 - 20 - len(split.train)


def test_empty_bin_is_refused_unless_allowed():
    sources, lengths = fixture_corpus()
    lengths = [n if not 120 <= n < 140 else 79 for n in lengths]
    with pytest.raises(ValueError, match=r"\[120,140\) empty.*--allow-empty-bins"):
        s2l_split(sources, lengths, 80, BINS, valid_size=10)
    split = s2l_split(sources, lengths, 80, BINS, valid_size=10, allow_empty_bins=True)
    assert split.stats["test_bins"]["[120,140)"] == 0


def test_bins_must_start_at_threshold_and_end_open():
    sources, lengths = fixture_corpus()
    with pytest.raises(ValueError, match="start at --threshold"):
        s2l_split(sources, lengths, 80, parse_buckets("90,100+"), valid_size=1)
    with pytest.raises(ValueError, match="end open"):
        s2l_split(sources, lengths, 80, parse_buckets("80,100"), valid_size=1)


def write_corpus(directory, sources, targets, name="corpus"):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (directory / f"{name}.de").write_text("\n".join(targets) + "\n", encoding="utf-8")
    return str(directory / name)


def test_cli_word_unit(tmp_path):
    sources, lengths = fixture_corpus()
    targets = [s.upper() for s in sources]
    prefix = write_corpus(tmp_path / "in", sources, targets)
    out = tmp_path / "out"
    run = cli("fairseq-pe-s2l-split", "--corpus", prefix, "-s", "en", "-t", "de", "--out", str(out),
              "--unit", "word", "--valid-size", "10", "--short-test-size", "5")
    assert "158 shorter than 80 word tokens (95.18%" in run.stdout
    assert "[80,100) 2, [100,120) 2, [120,140) 2, [140,inf) 2" in run.stdout
    read = lambda name: (out / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    assert [len(s.split()) for s in read("test.en")] == [80, 99, 100, 119, 120, 139, 140, 400]
    assert read("test.lengths") == ["80", "99", "100", "119", "120", "139", "140", "400"]
    assert [t.lower() for t in read("test.de")] == read("test.en")  # pairs stay aligned
    assert len(read("train.en")) == len(read("train.de")) == 143
    assert len(read("valid.en")) == 10 and len(read("test-short.en")) == 5
    stats = json.loads((out / "stats.json").read_text())
    assert stats["unit"] == "word" and stats["test"] == 8


def test_cli_refuses_an_empty_bin_and_misaligned_files(tmp_path):
    sources = [sentence(n, "w") for n in [5, 6, 7, 85, 90]]
    prefix = write_corpus(tmp_path / "in", sources, sources)
    run = cli("fairseq-pe-s2l-split", "--corpus", prefix, "-s", "en", "-t", "de", "--out", str(tmp_path / "o"),
              "--unit", "word", "--valid-size", "1", check=False)
    assert run.returncode != 0
    assert "[100,120), [120,140), [140,inf) empty" in run.stderr and "--allow-empty-bins" in run.stderr
    (tmp_path / "in" / "corpus.de").write_text("one line\n")
    run = cli("fairseq-pe-s2l-split", "--corpus", prefix, "-s", "en", "-t", "de", "--out", str(tmp_path / "o"),
              "--unit", "word", "--valid-size", "1", check=False)
    assert run.returncode != 0 and "corpus.en has 5 lines but" in run.stderr


@pytest.mark.shared_data
def test_cli_subword_unit_and_binarize_on_real_data(tmp_path):
    base = shared_data("mt", "en-de")
    d = tmp_path / "in"
    for name, path, n in [("tatoeba", "tatoeba/tatoeba-v2021-08-07", 300),
                          ("news2020", "wmt/newstest2020.de-en", 120)]:
        src = open(os.path.join(base, path + ".en"), encoding="utf-8").read().splitlines()[:n]
        tgt = open(os.path.join(base, path + ".de"), encoding="utf-8").read().splitlines()[:n]
        write_corpus(d / name, src, tgt, name)
    out = tmp_path / "out"
    cli("fairseq-pe-s2l-split", "--corpus-dir", str(d), "-s", "en", "-t", "de", "--out", str(out),
        "--spm-vocab-size", "400", "--threshold", "40", "--bins", "40,80+", "--valid-size", "20",
        "--short-test-size", "10", "--binarize")
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    test = (out / "test.en").read_text(encoding="utf-8").splitlines()
    lengths = [int(x) for x in (out / "test.lengths").read_text().split()]
    assert lengths == [len(p) for p in sp.encode(test, out_type=str)] and min(lengths) >= 40
    train = (out / "train.en").read_text(encoding="utf-8").splitlines()
    assert max(len(p) for p in sp.encode(train, out_type=str)) < 40
    stats = json.loads((out / "stats.json").read_text())
    assert stats["train"] + stats["valid"] + stats["test_short"] + stats["test"] + \
        stats["train_pairs_removed_as_duplicates_of_held_back_sources"] + stats["empty_source_pairs_left_out"] == 420
    assert stats["test_subsets"] == {"test": "test", "test-short": "test1"}
    for subset in ("train", "valid", "test", "test1"):
        assert (out / "data-bin" / f"{subset}.en-de.en.idx").exists()


def one_error(run):
    """Exit status 2 and one ``PROG: error: ...`` line, no traceback; returns that line."""
    errors = [line for line in run.stderr.splitlines() if ": error: " in line]
    assert run.returncode == 2 and len(errors) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    return errors[0]


def test_cli_never_writes_over_its_inputs_and_replaces_a_split_only_with_force(tmp_path):
    sources, _ = fixture_corpus()
    prefix = write_corpus(tmp_path / "in", sources, [s.upper() for s in sources], name="train")
    corpus = {p.name: p.read_bytes() for p in (tmp_path / "in").iterdir()}
    common = ["-s", "en", "-t", "de", "--unit", "word", "--valid-size", "10"]
    # --out the corpus's folder: the split's train.en would replace the corpus train.en
    err = one_error(cli("fairseq-pe-s2l-split", "--corpus", prefix, "--out", str(tmp_path / "in"), *common,
                        check=False))
    assert f"--out: would write over the input --corpus {prefix}." in err
    # --out inside a --corpus-dir: the next run would read the split as a corpus
    err = one_error(cli("fairseq-pe-s2l-split", "--corpus-dir", str(tmp_path / "in"), "--out",
                        str(tmp_path / "in" / "split"), *common, check=False))
    assert "is inside --corpus-dir" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "in").iterdir()} == corpus  # untouched

    out = tmp_path / "out"
    cli("fairseq-pe-s2l-split", "--corpus", prefix, "--out", str(out), *common)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    err = one_error(cli("fairseq-pe-s2l-split", "--corpus", prefix, "--out", str(out), *common, "--seed", "2",
                        check=False))
    assert "exist already (an earlier run's results): pass --force" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    cli("fairseq-pe-s2l-split", "--corpus", prefix, "--out", str(out), *common, "--seed", "2", "--force")
    assert json.loads((out / "stats.json").read_text())["seed"] == 2
    assert (out / "valid.en").read_bytes() != before["valid.en"]  # another draw of the held-back pairs
    assert sorted(p.name for p in out.iterdir()) == sorted(before)  # no temporary file left
