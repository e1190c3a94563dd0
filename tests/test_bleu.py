"""Strict generate-output reading and bucketed sacreBLEU."""

import pytest
import sacrebleu

from fairseq_pe.translation.bleu import GenerateOutputError, bucketed_bleu, read_generate_output

SOURCES = ["a b", "a b c d e", "a b c", "a b c d e f g"]
REFS = ["x y", "x y z w v", "x z y", "x y z w v u t"]
HYPS = ["x y", "x y z v w", "x y", "x y z w v u"]


def write_generate(path, ids_with_hyps):
    lines = []
    for i, hyps in ids_with_hyps:
        lines.append(f"S-{i}\t{SOURCES[i]}")
        lines.append(f"T-{i}\t{REFS[i]}")
        for h in hyps:
            lines += [f"H-{i}\t-0.5\t{h}", f"D-{i}\t-0.5\t{h}", f"P-{i}\t-0.5 -0.5"]
    path.write_text("\n".join(lines) + "\nGenerate test with beam=4: BLEU4 = 1.0\n")
    return str(path)


def test_reads_every_sentence_in_id_order(tmp_path):
    path = write_generate(tmp_path / "gen.txt", [(i, [HYPS[i]]) for i in (2, 0, 3, 1)])
    out = read_generate_output(path, expected=4)
    assert [s.hypothesis for s in out] == HYPS
    assert [s.source for s in out] == SOURCES


def test_missing_hypothesis_is_an_error(tmp_path):
    path = write_generate(tmp_path / "gen.txt", [(0, [HYPS[0]]), (1, [HYPS[1]]), (3, [HYPS[3]])])
    with pytest.raises(GenerateOutputError, match=r"ids \[2\]"):
        read_generate_output(path, expected=4)


def test_duplicate_hypothesis_is_an_error(tmp_path):
    path = write_generate(tmp_path / "gen.txt", [(i, [HYPS[i]] * (2 if i == 1 else 1)) for i in range(4)])
    with pytest.raises(GenerateOutputError, match="more than one"):
        read_generate_output(path, expected=4)


def test_bucket_scores_equal_sacrebleu_on_each_bucket():
    lengths = [len(s.split()) for s in SOURCES]
    res = bucketed_bleu(HYPS, REFS, lengths, [(1, 4), (4, None)])
    short = sacrebleu.corpus_bleu([HYPS[0], HYPS[2]], [[REFS[0], REFS[2]]])
    long = sacrebleu.corpus_bleu([HYPS[1], HYPS[3]], [[REFS[1], REFS[3]]])
    assert res["[1,4)"] == {"bleu": pytest.approx(short.score), "n": 2, "ratio": pytest.approx(4 / 5)}
    assert res["[4,inf)"] == {"bleu": pytest.approx(long.score), "n": 2,
                              "ratio": pytest.approx(long.sys_len / long.ref_len)}
    assert (long.sys_len, long.ref_len) == (11, 12)
    assert res["all"]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert res["signature"].startswith("nrefs:1")


def test_length_outside_every_bucket_is_an_error():
    with pytest.raises(GenerateOutputError, match="none of the buckets"):
        bucketed_bleu(HYPS, REFS, [2, 5, 3, 7], [(1, 4), (4, 7)])


def test_misaligned_inputs_are_an_error():
    with pytest.raises(GenerateOutputError, match="line-aligned"):
        bucketed_bleu(HYPS, REFS[:3], [2, 5, 3, 7], [(1, None)])


def test_bootstrap_interval_is_sacrebleus_own():
    import sacrebleu

    from fairseq_pe.translation.bleu import bucketed_bleu

    refs = [f"the cat number {i} sat on the mat today" for i in range(40)]
    hyps = [r if i % 3 else r.replace("cat", "dog").replace("today", "") for i, r in enumerate(refs)]
    res = bucketed_bleu(hyps, refs, [i % 2 + 1 for i in range(40)], [(1, 2), (2, None)], n_bootstrap=300)
    expect = sacrebleu.metrics.BLEU().corpus_score(hyps, [refs], n_bootstrap=300)
    assert res["all"]["bleu"] == pytest.approx(expect.score)
    assert res["all"]["bleu_ci"] == pytest.approx(expect._ci) and res["all"]["bleu_ci"] > 0
    assert res["all"]["bleu_bs_mean"] == pytest.approx(expect._mean)
    assert "bs:300" in res["signature"]
    assert "bleu_ci" not in bucketed_bleu(hyps, refs, [1] * 40, [(1, None)])["all"]  # only when asked
