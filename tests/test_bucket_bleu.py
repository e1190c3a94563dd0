"""``fairseq-pe-bucket-bleu`` on handmade generate output: per-bucket sacreBLEU, segmentation, errors."""

import json
import os
import re

import pytest
import sacrebleu

from helpers import cli

SOURCES = ["Das ist gut .", "Ein sehr langer Satz mit vielen Wörtern hier", "Kurz", "Noch ein langer Satz mit Wörtern"]
REFS = ["This is good.", "A very long sentence with many words here", "Short", "Another long well-known sentence with words"]
HYPS = ["This is good.", "A very long sentence with lots of words", "Brief", "Another long well-known phrase with words"]


def pieces(text):
    """sentencepiece-style pieces, as fairseq-generate writes H- lines without --post-process."""
    return " ".join("\u2581" + w for w in text.split())


def write_generate(path, hyps, ids=None, tag_text=pieces):
    ids = list(range(len(hyps))) if ids is None else ids
    lines = []
    for i in ids:
        lines += [f"S-{i}\t{pieces(SOURCES[i])}", f"T-{i}\t{pieces(REFS[i])}",
                  f"H-{i}\t-0.3\t{tag_text(hyps[i])}", f"D-{i}\t-0.3\t{tag_text(hyps[i])}", f"P-{i}\t-0.1 -0.2"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "src").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    (tmp_path / "ref").write_text("\n".join(REFS) + "\n", encoding="utf-8")
    return tmp_path


def bucket_bleu(files, *extra, check=True):
    return cli("fairseq-pe-bucket-bleu", "--source", str(files / "src"), "--reference", str(files / "ref"),
               "--unit", "word", "--buckets", "1,5,100", *extra, check=check)


def test_per_bucket_scores_equal_sacrebleu_for_several_systems(files):
    gen_a = write_generate(files / "a.txt", HYPS)
    gen_b = write_generate(files / "b.txt", REFS)  # a perfect system
    out = str(files / "res")
    run = bucket_bleu(files, "--system", f"sys-a={gen_a}", "--system", f"perfect={gen_b}", "--out", out)
    res = json.loads(open(out + ".json").read())
    short, long = [0, 2], [1, 3]  # 4, 1 words vs 9, 6 words
    expect = lambda idx: sacrebleu.corpus_bleu([HYPS[i] for i in idx], [[REFS[i] for i in idx]]).score  # noqa
    assert res["systems"]["sys-a"]["[1,5)"]["bleu"] == pytest.approx(expect(short))
    assert res["systems"]["sys-a"]["[5,100)"]["bleu"] == pytest.approx(expect(long))
    assert res["systems"]["sys-a"]["[1,5)"]["n"] == res["systems"]["sys-a"]["[5,100)"]["n"] == 2
    short_score = sacrebleu.corpus_bleu([HYPS[i] for i in short], [[REFS[i] for i in short]])
    assert (short_score.sys_len, short_score.ref_len) == (5, 5)  # "This is good." 4 tokens, "Brief" 1
    assert res["systems"]["sys-a"]["[1,5)"]["ratio"] == pytest.approx(1.0)
    assert res["systems"]["sys-a"]["all"]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert res["systems"]["perfect"]["all"]["bleu"] == pytest.approx(100.0)
    # every BLEU with the half-width of sacreBLEU's bootstrap interval (1000 resamples by default)
    assert re.search(r"\| sys-a +\| [\d.]+ ±[\d.]+ +\| [\d.]+ ±[\d.]+ +\| [\d.]+ ±[\d.]+ +\|", run.stdout)
    assert res["systems"]["sys-a"]["all"]["bleu_ci"] >= 0
    assert "nrefs:1|bs:1000|seed:12345|case:mixed|eff:no|tok:13a" in run.stdout
    assert re.search(r"length ratio\n.*\n.*\n\| sys-a +\| 1.00 +\|", run.stdout)
    assert open(out + ".png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "perfect" in open(out + ".txt").read()


def test_plain_hypotheses_and_tokenized_compound_split_bleu(files):
    (files / "hyp").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    out = str(files / "res")
    bucket_bleu(files, "--plain", "--system", f"plain={files / 'hyp'}", "--tokenized-bleu", "en", "--out", out)
    res = json.loads(open(out + ".json").read())["systems"]["plain"]
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang="en")
    split = lambda s: re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", tok.tokenize(s, return_str=True, escape=False))  # noqa
    expected = sacrebleu.corpus_bleu([split(h) for h in HYPS], [[split(r) for r in REFS]], tokenize="none").score
    assert "##AT##-##AT##" in split(REFS[3])
    assert res["all"]["tok_bleu"] == pytest.approx(expected)
    assert res["all"]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)


def test_lengths_file_and_subword_segmentation_undone(files):
    gen = write_generate(files / "a.txt", HYPS)
    (files / "lengths").write_text("85\n130\n81\n150\n")
    out = str(files / "res")
    cli("fairseq-pe-bucket-bleu", "--reference", str(files / "ref"), "--lengths", str(files / "lengths"),
        "--system", f"a={gen}", "--out", out)
    res = json.loads(open(out + ".json").read())["systems"]["a"]
    assert [res[b]["n"] for b in ("[80,100)", "[100,120)", "[120,140)", "[140,inf)")] == [2, 0, 1, 1]
    assert res["[80,100)"]["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu([HYPS[0], HYPS[2]], [[REFS[0], REFS[2]]]).score)  # "▁" pieces were joined back


def test_missing_and_duplicate_hypotheses_are_refused(files):
    missing = write_generate(files / "m.txt", HYPS, ids=[0, 1, 3])
    run = bucket_bleu(files, "--system", f"m={missing}", check=False)
    assert run.returncode != 0 and "no D- hypothesis for 1 sentence(s), e.g. ids [2]" in run.stderr
    dup = write_generate(files / "d.txt", HYPS, ids=[0, 1, 2, 3, 1])
    run = bucket_bleu(files, "--system", f"d={dup}", check=False)
    assert run.returncode != 0 and "appears twice" in run.stderr


def test_files_of_different_lengths_are_refused(files):
    (files / "hyp").write_text("\n".join(HYPS[:3]) + "\n", encoding="utf-8")
    run = bucket_bleu(files, "--plain", "--system", f"p={files / 'hyp'}", check=False)
    assert run.returncode != 0 and "has 3 lines but --reference" in run.stderr
    (files / "hyp").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    (files / "src").write_text("\n".join(SOURCES[:2]) + "\n", encoding="utf-8")
    run = bucket_bleu(files, "--plain", "--system", f"p={files / 'hyp'}", check=False)
    assert run.returncode != 0 and "--source" in run.stderr and "line-aligned" in run.stderr


# ---------------------------------------------------------------------------------------------
# issue 14: no user error loses data; a sentence that was not translated is named, never dropped


def run_main(capsys, *argv):
    """``fairseq-pe-bucket-bleu`` in-process: (exit status, stderr)."""
    from fairseq_pe.translation import bucket_bleu as tool

    try:
        tool.main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == (code != 0), err  # one line: "PROG: error: ..."
    return code, "\n".join(errors) + "\n"


def test_out_never_replaces_an_input_and_replaces_results_only_with_force(files, capsys):
    gen = write_generate(files / "a.txt", HYPS)
    (files / "res.txt").write_text("\n".join(REFS) + "\n", encoding="utf-8")  # the reference, named like --out's
    common = ["--source", str(files / "src"), "--unit", "word", "--buckets", "1,5,100", "--system", f"a={gen}"]
    for extra in ([], ["--force"]):
        code, err = run_main(capsys, *common, "--reference", str(files / "res.txt"), "--out", str(files / "res"),
                             *extra)
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert f"error: --out: would write over the input --reference {files / 'res.txt'}" in err
    assert (files / "res.txt").read_text(encoding="utf-8") == "\n".join(REFS) + "\n"
    out = str(files / "scores")
    assert run_main(capsys, *common, "--reference", str(files / "ref"), "--out", out)[0] == 0
    before = {ext: open(out + ext, "rb").read() for ext in (".txt", ".json", ".png")}
    code, err = run_main(capsys, *common, "--reference", str(files / "ref"), "--out", out)
    assert code == 2 and "scores.txt, " in err and "exist already (an earlier run's results): pass --force" in err
    assert {ext: open(out + ext, "rb").read() for ext in before} == before
    assert run_main(capsys, *common, "--reference", str(files / "ref"), "--out", out, "--force")[0] == 0
    assert sorted(p.name for p in files.iterdir()) == ["a.txt", "ref", "res.txt", "scores.json", "scores.png",
                                                       "scores.txt", "src"]  # no temporary file left


def test_user_mistakes_are_one_line_errors(files, capsys):
    gen = write_generate(files / "a.txt", HYPS)
    (files / "lengths").write_text("3\nx\n5\n6\n")
    cases = [
        (["--reference", str(files / "nope"), "--source", str(files / "src")], "--reference"),
        (["--reference", str(files / "ref"), "--lengths", str(files / "lengths")], "line 2 is 'x'"),
        (["--reference", str(files / "ref"), "--source", str(files / "src"), "--unit", "subword", "--spm-model",
          str(files / "ref")], "not a sentencepiece model"),
    ]
    for argv, fragment in cases:
        code, err = run_main(capsys, "--system", f"a={gen}", *argv)
        assert code == 2 and fragment in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_sentences_not_translated_are_named_and_their_scores_marked():
    from fairseq_pe.translation.bleu import GenerateOutputError, bucketed_bleu, read_generate_output
    from fairseq_pe.translation.bucket_bleu import format_table

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "gen.txt")
        with open(path, "w", encoding="utf-8") as f:  # sentence 1 was skipped by fairseq-generate
            for i in (0, 2, 3):
                f.write(f"S-{i}\t{SOURCES[i]}\nD-{i}\t-0.1\t{HYPS[i]}\n")
        got = read_generate_output(path, expected=4, not_translated=[1])
        assert [s.hypothesis for s in got] == [HYPS[0], None, HYPS[2], HYPS[3]]
        with pytest.raises(GenerateOutputError, match=r"no D- hypothesis for 1 sentence\(s\), e.g. ids \[1\]"):
            read_generate_output(path, expected=4)
        with pytest.raises(GenerateOutputError, match=r"sentence\(s\) \[2\] were expected to be skipped"):
            read_generate_output(path, expected=4, not_translated=[1, 2])
    hyps = [s.hypothesis for s in got]
    lengths = [4, 9, 1, 6]
    res = bucketed_bleu(hyps, REFS, lengths, [(1, 5), (5, 100)], missing_reason="1 source too long")
    short = sacrebleu.corpus_bleu([HYPS[0], HYPS[2]], [[REFS[0], REFS[2]]]).score
    assert res["[1,5)"]["bleu"] == pytest.approx(short) and res["[1,5)"]["n"] == 2  # computed: nothing missing
    assert res["[5,100)"] == {"bleu": None, "n": 2, "ratio": None, "na": "1 source too long"}  # never on a subset
    assert res["all"]["bleu"] is None and res["all"]["n"] == 4
    with pytest.raises(GenerateOutputError, match="no hypothesis for 1 sentence"):
        bucketed_bleu(hyps, REFS, lengths, [(1, 5), (5, 100)])
    none = bucketed_bleu([None] * 4, REFS, lengths, [(1, 5), (5, 100)], missing_reason="decoding failed")
    assert none["all"]["na"] == "decoding failed" and none["signature"].startswith("nrefs:1")
    table = format_table({"a": res, "b": bucketed_bleu(HYPS, REFS, lengths, [(1, 5), (5, 100)])},
                         [(1, 5), (5, 100)], "t")
    assert re.search(r"^\| a +\| [\d.]+ +\| n/a \[1\] +\| n/a \[1\] +\|$", table, re.M), table
    assert "\n[1] a: 1 source too long\n" in table and re.search(r"^\| b +\| [\d.]+ +\| [\d.]+ +\| [\d.]+ +\|$",
                                                                  table, re.M)
