"""SQuAD v1.1 / v2.0: official scoring, windows and labels, span decoding, the span_prediction task
and criterion, end to end through the CLIs (fairseq-pe-prepare-squad, fairseq-train masked_lm then
span_prediction, fairseq-pe-squad-predict) with two position encodings, and checkpoint reload."""

import copy
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import PLUGIN, cli, exit_status, forked, shared_data

from fairseq_pe.bert import squad
from fairseq_pe.data_prep import squad as prep

# The tests marked shared_data read the official dev set (../shared/data/squad/dev-v1.1.json, CC BY-SA,
# not shipped here); the others run everywhere.


# ---------------------------------------------------------------------------------------------
# official scoring, against numbers worked out by hand


def test_normalisation_official_rules():
    # lower-case, punctuation dropped, articles a/an/the dropped as whole words, whitespace collapsed
    assert squad.normalize_answer("The  Quick, brown FOX!") == "quick brown fox"
    assert squad.normalize_answer("an apple a day; theatre") == "apple day theatre"
    assert squad.normalize_answer("Levi's Stadium.") == "levis stadium"
    assert squad.normalize_answer("\"golden anniversary\"") == "golden anniversary"
    assert squad.normalize_answer("24–10") == "24–10"  # the en dash is not in string.punctuation
    assert squad.normalize_answer("A") == ""


def test_exact_match_and_f1_v1_by_hand():
    assert squad.exact_match_v1("the Denver Broncos.", "Denver broncos") == 1.0
    assert squad.exact_match_v1("Denver", "Denver Broncos") == 0.0
    # "cat sat on mat" vs "cat on mat": 3 common, P = 3/4, R = 1 -> F1 = 2 * 0.75 / 1.75 = 6/7
    assert squad.f1_v1("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7)
    # repeated tokens count as a multiset: "x y y" vs "y z": 1 common, P = 1/3, R = 1/2 -> 2/5
    assert squad.f1_v1("x y y", "y z") == pytest.approx(0.4)
    assert squad.f1_v1("Broncos", "Carolina Panthers") == 0.0
    # v1.1: a prediction that normalises to nothing scores F1 0 even against an empty gold
    assert squad.f1_v1("the", "a") == 0.0 and squad.exact_match_v1("the", "a") == 1.0

    data = [{"paragraphs": [{"context": "...", "qas": [
        {"id": "q1", "answers": [{"text": "Denver Broncos"}, {"text": "the Denver Broncos"}, {"text": "Broncos"}]},
        {"id": "q2", "answers": [{"text": "Santa Clara, California"}, {"text": "Levi's Stadium"}]},
        {"id": "q3", "answers": [{"text": "gold"}]},
    ]}]}]
    # q1: exact via "Broncos" (1, 1); q2: "Levi's Stadium in Santa Clara" vs "Levi's Stadium" ->
    # tokens levis stadium in santa clara (5) vs levis stadium (2): P 2/5, R 1 -> 4/7; vs "Santa Clara,
    # California": santa clara common, P 2/5, R 2/3 -> 1/2; max 4/7, EM 0; q3 missing -> 0, 0
    preds = {"q1": "broncos", "q2": "Levi's Stadium in Santa Clara"}
    out = squad.evaluate_v1(data, preds)
    assert out["total"] == 3 and out["missing"] == 1
    assert out["exact_match"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(100 * (1 + 4 / 7) / 3)


def test_scores_v2_no_answer_by_hand():
    assert squad.f1_v2("", "") == 1.0 and squad.exact_match_v2("", "") == 1.0
    assert squad.f1_v2("", "Denver") == 0.0 and squad.f1_v2("Denver", "") == 0.0
    data = [{"paragraphs": [{"context": "...", "qas": [
        {"id": "h1", "answers": [{"text": "Denver Broncos"}]},                 # pred "Denver": F1 2/3, EM 0
        {"id": "h2", "answers": [{"text": "February 7, 2016"}]},               # pred "": 0, 0
        {"id": "h3", "answers": [{"text": "the"}, {"text": "gold"}]},          # "the" -> ""; dropped; pred gold: 1
        {"id": "n1", "answers": [], "is_impossible": True},                     # pred "": 1, 1
        {"id": "n2", "answers": [], "is_impossible": True},                     # pred "Carolina": 0, 0
    ]}]}]
    preds = {"h1": "Denver", "h2": "", "h3": "Gold.", "n1": "", "n2": "Carolina"}
    out = squad.evaluate(data, preds, "2.0")
    assert out["total"] == 5 and out["HasAns_total"] == 3 and out["NoAns_total"] == 2
    assert out["exact"] == pytest.approx(100 * 2 / 5) == out["exact_match"]
    assert out["f1"] == pytest.approx(100 * (2 / 3 + 0 + 1 + 1 + 0) / 5)
    assert out["HasAns_exact"] == pytest.approx(100 / 3)
    assert out["HasAns_f1"] == pytest.approx(100 * (2 / 3 + 1) / 3)
    assert out["NoAns_exact"] == pytest.approx(50.0) and out["NoAns_f1"] == pytest.approx(50.0)


# ---------------------------------------------------------------------------------------------
# a tiny sentencepiece model and dictionary, and SQuAD files made from the official dev set


@pytest.fixture(scope="module")
def spm_dict(tmp_path_factory):
    """A unigram sentencepiece model (300 pieces) and a fairseq dictionary of its pieces, trained on
    the contexts of three dev articles; plus a masked-LM corpus of those contexts."""
    import sentencepiece as spm
    from fairseq.data import Dictionary, indexed_dataset

    dev_json = shared_data("squad", "dev-v1.1.json")
    root = tmp_path_factory.mktemp("spm")
    with open(dev_json, encoding="utf-8") as f:
        dev = json.load(f)
    texts = [p["context"] for a in dev["data"][:3] for p in a["paragraphs"]]
    (root / "text.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(root / "text.txt"), model_prefix=str(root / "spm"), vocab_size=300,
                                   model_type="unigram", character_coverage=1.0, num_threads=1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    encoded = [sp.encode(t, out_type=str) for t in texts]
    d = Dictionary()
    for pieces in encoded:
        for piece in pieces:
            d.add_symbol(piece)
    d.finalize()
    mono = root / "mono"
    mono.mkdir()
    d.save(str(mono / "dict.txt"))
    for split, lines in (("train", encoded[:-8]), ("valid", encoded[-8:])):  # as fairseq-preprocess writes
        builder = indexed_dataset.make_builder(str(mono / f"{split}.bin"), "mmap", vocab_size=len(d))
        for pieces in lines:
            builder.add_item(torch.IntTensor([d.index(p) for p in pieces] + [d.eos()]))
        builder.finalize(str(mono / f"{split}.idx"))
    return {"spm": str(root / "spm.model"), "dict": str(mono / "dict.txt"), "mono": str(mono), "sp": sp,
            "dev": dev}


def subset(dev: dict, articles, paragraphs: int, questions: int) -> dict:
    out = []
    for a in articles:
        ps = [{"context": p["context"], "qas": copy.deepcopy(p["qas"][:questions])}
              for p in dev["data"][a]["paragraphs"][:paragraphs]]
        out.append({"title": dev["data"][a]["title"], "paragraphs": ps})
    return {"version": "1.1", "data": out}


def make_v2(dev: dict, articles, paragraphs: int, questions: int) -> dict:
    """A SQuAD 2.0 file by hand: dev questions plus one impossible question per paragraph."""
    data = subset(dev, articles, paragraphs, questions)
    for a in data["data"]:
        for k, p in enumerate(a["paragraphs"]):
            word = p["context"].split()[3]
            p["qas"].append({"id": f"impossible-{a['title']}-{k}", "question": "What is the capital city of Mars?",
                             "answers": [], "is_impossible": True,
                             "plausible_answers": [{"text": word, "answer_start": p["context"].index(word)}]})
            for qa in p["qas"]:
                qa.setdefault("is_impossible", False)
    data["version"] = "v2.0"
    return data


def write_json(path, obj) -> str:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    return str(path)


def read_prepared(dest, split):
    from fairseq.data import Dictionary
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    d = Dictionary.load(os.path.join(dest, "input0", "dict.txt"))
    ds = MMapIndexedDataset(os.path.join(dest, "input0", split))
    tokens = [ds[i].tolist() for i in range(len(ds))]
    with open(os.path.join(dest, f"{split}.spans")) as f:
        spans = [tuple(map(int, line.split())) for line in f]
    metas = squad.read_features(os.path.join(dest, f"{split}.features.jsonl"))
    return d, tokens, spans, metas


# ---------------------------------------------------------------------------------------------
# windows and labels


@pytest.fixture(scope="module")
def long_context(spm_dict, tmp_path_factory):
    """The first dev paragraph (775 characters), its 8 first questions and one answer strictly inside a
    piece, prepared with 80 tokens per feature and a stride of 16 pieces."""
    root = tmp_path_factory.mktemp("windows")
    data = subset(spm_dict["dev"], [0], 1, 8)
    p = data["data"][0]["paragraphs"][0]
    res = spm_dict["sp"].encode(p["context"], out_type="offset_mapping")
    b, e = next((b, e) for piece, (b, e) in zip(res["pieces"], res["offsets"])
                if len(piece.lstrip("▁")) >= 4 and piece.lstrip("▁").isalpha())
    b += len(p["context"][b:e]) - len(p["context"][b:e].lstrip())
    inner = p["context"][b + 1:e - 1]  # a proper substring of one piece: cannot be on piece boundaries
    p["qas"].append({"id": "inside-a-piece", "question": "Which letters?",
                     "answers": [{"text": inner, "answer_start": b + 1}]})
    path = write_json(root / "long.json", data)
    dest = str(root / "bin")
    assert prep.main(["--valid", path, "--spm-model", spm_dict["spm"], "--dict", spm_dict["dict"], "--destdir", dest,
                      "--max-length", "80", "--doc-stride", "16", "--max-query-length", "50"]) == 0
    return data, path, dest


@pytest.mark.shared_data
def test_stride_windows_put_the_gold_span_where_it_belongs(long_context, spm_dict):
    data, _, dest = long_context
    d, tokens, spans, metas = read_prepared(dest, "valid")
    sp = spm_dict["sp"]
    p = data["data"][0]["paragraphs"][0]
    context = p["context"]
    n_pieces = len(sp.encode(context))
    qas = {qa["id"]: qa for qa in p["qas"]}
    with open(os.path.join(dest, "prepare.json")) as f:
        stats = json.load(f)["splits"]["valid"]
    assert len(tokens) == len(spans) == len(metas) == stats["features"]
    by_q = {}
    for tok, span, meta in zip(tokens, spans, metas):
        by_q.setdefault(meta["qid"], []).append((tok, span, meta))
    assert set(by_q) == set(qas)

    misaligned = 0
    for qid, feats in by_q.items():
        qa = qas[qid]
        gold = qa["answers"][0]
        g0, g1 = gold["answer_start"], gold["answer_start"] + len(gold["text"])
        q_len = len(sp.encode(qa["question"]))
        assert len(feats) > 1  # the context needs several windows
        starts = [m["doc_start"] for _, _, m in feats]
        assert starts[0] == 0 and all(b - a == 16 for a, b in zip(starts, starts[1:]))
        last_tok, _, last = feats[-1]
        assert last["doc_start"] + len(last["offsets"]) == n_pieces  # the windows cover the whole context
        labelled = 0
        for tok, (s, e), meta in feats:
            cs = meta["context_start"]
            assert len(tok) <= 80 and cs == q_len + 3
            assert tok[0] == d.bos() and tok[cs - 2:cs] == [d.eos(), d.eos()] and tok[-1] == d.eos()
            assert len(tok) == cs + len(meta["offsets"]) + 1
            w0, w1 = meta["offsets"][0][0], meta["offsets"][-1][1]  # characters the window covers
            if (s, e) == (0, 0):
                # the answer is not wholly inside this window
                assert not (w0 <= g0 and g1 <= w1), (qid, meta["feature"])
                continue
            labelled += 1
            assert cs <= s <= e < len(tok) - 1
            text = context[meta["offsets"][s - cs][0]:meta["offsets"][e - cs][1]]
            decoded = sp.decode_pieces([d[t] for t in tok[s:e + 1]])
            if text == gold["text"]:
                assert decoded.strip() == gold["text"]
            else:
                assert gold["text"] in text and gold["text"] in decoded  # the covering pieces
                misaligned += 1
        assert labelled >= 1, qid  # the stride leaves every short answer wholly inside some window
    assert misaligned >= 1  # "inside-a-piece"
    # the labelled answer of "inside-a-piece" is counted, once per question
    assert stats["labelled answers not on piece boundaries (covering pieces used)"] >= 1
    assert stats["answerable questions whose answer is inside no window"] == 0


def test_windows_and_max_context_like_bert():
    assert prep.doc_windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert prep.doc_windows(4, 4, 3) == [(0, 4)]
    assert prep.doc_windows(5, 4, 9) == [(0, 4), (4, 1)]  # a stride beyond the window: no gap
    flags = prep.max_context_flags([(0, 4), (3, 4), (6, 4)])
    # piece 3: min(3, 0) + 0.04 in window 0 vs min(0, 3) + 0.04 in window 1: the first wins ties;
    # piece 6 likewise goes to window 1 rather than 2
    assert flags == [[True, True, True, True], [False, True, True, True], [False, True, True, True]]
    flags = prep.max_context_flags([(0, 6), (2, 6)])
    # piece 3: min(3, 2) + 0.06 = 2.06 in window 0 vs min(1, 4) + 0.06 = 1.06 in window 1
    assert flags == [[True, True, True, True, False, False], [False, False, True, True, True, True]]


@pytest.mark.shared_data
def test_gold_logits_map_back_to_the_gold_text(long_context):
    data, _, dest = long_context
    _, tokens, spans, metas = read_prepared(dest, "valid")
    contexts = squad.squad_contexts(data)
    # start/end logits of 10 at the gold pieces in every window that has them (whole answer or not)
    gold_piece = {}
    for (s, e), meta in zip(spans, metas):
        if s:
            gold_piece[meta["qid"]] = (meta["doc_start"] + s - meta["context_start"],
                                       meta["doc_start"] + e - meta["context_start"])
    logits = []
    for tok, meta in zip(tokens, metas):
        start, end = np.zeros(len(tok)), np.zeros(len(tok))
        g0, g1 = gold_piece[meta["qid"]]
        cs, ds = meta["context_start"], meta["doc_start"]
        if ds <= g0 < ds + len(meta["offsets"]):
            start[cs + g0 - ds] = 10
        if ds <= g1 < ds + len(meta["offsets"]):
            end[cs + g1 - ds] = 10
        logits.append((start, end))
    preds, nbest, _, counts = squad.predict_answers(metas, logits, contexts, version="1.1")
    for _, qa in squad.iter_questions(data["data"]):
        gold = qa["answers"][0]["text"]
        if qa["id"] == "inside-a-piece":
            assert gold in preds[qa["id"]] and preds[qa["id"]] != gold
        else:
            assert preds[qa["id"]] == gold
        assert nbest[qa["id"]][0]["score"] == pytest.approx(20)
    assert counts["questions"] == 9
    # a maximum answer length shorter than the gold span: never the gold text
    short, _, _, _ = squad.predict_answers(metas, logits, contexts, max_answer_length=1)
    q = "56be4db0acb8001400a502ee"  # "Santa Clara, California": several pieces
    assert short[q] != preds[q] and len(short[q]) < len(preds[q])


@pytest.mark.shared_data
def test_v2_no_answer_and_threshold(spm_dict, tmp_path):
    data = make_v2(spm_dict["dev"], [0], 2, 3)
    path = write_json(tmp_path / "v2.json", data)
    dest = str(tmp_path / "bin")
    assert prep.main(["--valid", path, "--spm-model", spm_dict["spm"], "--dict", spm_dict["dict"], "--destdir", dest,
                      "--max-length", "64", "--doc-stride", "20", "--max-query-length", "40"]) == 0
    _, tokens, spans, metas = read_prepared(dest, "valid")
    impossible = {qa["id"] for _, qa in squad.iter_questions(data["data"]) if qa["is_impossible"]}
    assert len(impossible) == 2
    assert all(span == (0, 0) for span, m in zip(spans, metas) if m["qid"] in impossible)
    # gold logits: the labelled span where there is one, the null span (0, 0) elsewhere
    logits = []
    for tok, (s, e) in zip(tokens, spans):
        start, end = np.zeros(len(tok)), np.zeros(len(tok))
        start[s] += 10
        end[e] += 10
        logits.append((start, end))
    contexts = squad.squad_contexts(data)
    preds, _, null_odds, counts = squad.predict_answers(metas, logits, contexts, version="2.0")
    scores = squad.evaluate(data["data"], preds, "2.0")
    assert scores["exact"] == 100.0 and scores["f1"] == 100.0 and scores["NoAns_total"] == 2
    assert all(preds[q] == "" for q in impossible) and counts["predicted no answer"] == 2
    # s_null - best span: 20 - 0 for an impossible question, 0 - 20 for an answerable one
    assert all(null_odds[q] == pytest.approx(20) for q in impossible)
    assert all(v == pytest.approx(-20) for q, v in null_odds.items() if q not in impossible)
    # a threshold above 20 answers every impossible question anyway; below -20 answers none
    loose, _, _, _ = squad.predict_answers(metas, logits, contexts, version="2.0", null_score_diff_threshold=25)
    assert all(loose[q] != "" for q in impossible)
    strict, _, _, _ = squad.predict_answers(metas, logits, contexts, version="2.0", null_score_diff_threshold=-25)
    assert all(v == "" for v in strict.values())


@pytest.mark.shared_data
def test_bad_input_is_refused_with_the_flag_or_file(spm_dict, tmp_path, capsys):
    common = ["--spm-model", spm_dict["spm"], "--dict", spm_dict["dict"], "--destdir", str(tmp_path / "bin")]
    data = subset(spm_dict["dev"], [0], 1, 3)
    path = write_json(tmp_path / "a.json", data)
    assert exit_status(prep.main, ["--valid", path, "--max-query-length", "3", *common]) == 2
    err = capsys.readouterr().err
    assert "--max-query-length 3" in err and "never truncated" in err and "56be4db0acb8001400a502ec" in err
    bad = copy.deepcopy(data)
    bad["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 1
    assert exit_status(prep.main, ["--valid", write_json(tmp_path / "b.json", bad), *common]) == 2
    err = capsys.readouterr().err
    assert "b.json" in err and "56be4db0acb8001400a502ec" in err and "answer_start" in err
    v2 = make_v2(spm_dict["dev"], [0], 1, 1)
    assert exit_status(prep.main, ["--valid", write_json(tmp_path / "c.json", v2), "--version", "1.1", *common]) == 2
    assert "--version is 1.1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prep.main(["--valid", path, "--max-length", "20", "--max-query-length", "16", *common])
    assert "--max-query-length 16 leaves no room" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# task and criterion


@pytest.mark.shared_data
def test_task_batches_and_refuses_inconsistent_data(long_context, tmp_path):
    import shutil

    from fairseq_pe.tasks.span_prediction import SpanPredictionConfig, SpanPredictionTask

    _, _, dest = long_context
    _, tokens, spans, _ = read_prepared(dest, "valid")
    task = SpanPredictionTask.setup_task(SpanPredictionConfig(data=dest, max_positions=80, seed=1))
    assert task.source_dictionary[len(task.source_dictionary) - 1] == "<mask>"  # as masked_lm's
    ds = task.load_dataset("valid")
    batch = ds.collater([ds[i] for i in range(3)])
    ids = batch["id"].tolist()
    assert batch["net_input"]["src_tokens"].shape == (3, max(len(tokens[i]) for i in ids))
    assert batch["net_input"]["src_lengths"].tolist() == [len(tokens[i]) for i in ids]
    assert batch["target_start"].tolist() == [spans[i][0] for i in ids]
    assert batch["target_end"].tolist() == [spans[i][1] for i in ids]

    with pytest.raises(ValueError, match="--max-positions 40"):
        SpanPredictionTask.setup_task(SpanPredictionConfig(data=dest, max_positions=40, seed=1)).load_dataset("valid")
    other = tmp_path / "bin"
    shutil.copytree(dest, other)
    with open(other / "valid.spans", "a") as f:
        f.write("0 0\n")
    with pytest.raises(ValueError, match="valid.spans has .* lines but its split has"):
        SpanPredictionTask.setup_task(SpanPredictionConfig(data=str(other), seed=1)).load_dataset("valid")
    with pytest.raises(FileNotFoundError, match="test"):
        task.load_dataset("test")


class _FakeModel(nn.Module):
    def __init__(self, features):
        super().__init__()
        from fairseq_pe.models.span_head import SpanPredictionHead

        self.features = features
        self.span_heads = nn.ModuleDict({"span_head": SpanPredictionHead(features.size(-1))})

    def forward(self, src_tokens, features_only=False, **kwargs):
        assert features_only
        return self.features, {}


def test_criterion_is_bert_loss_with_padding_masked():
    from types import SimpleNamespace

    from fairseq.data import Dictionary

    from fairseq_pe.criterions.span_prediction import SpanPredictionCriterion, SpanPredictionCriterionConfig

    torch.manual_seed(0)
    d = Dictionary()
    pad = d.pad()
    tokens = torch.tensor([[0, 5, 6, 7, 2], [0, 5, 6, pad, pad]])
    model = _FakeModel(torch.randn(2, 5, 8))
    task = SimpleNamespace(cfg=SimpleNamespace(span_head_name="span_head"), source_dictionary=d)
    crit = SpanPredictionCriterion(SpanPredictionCriterionConfig(), task)
    sample = {"net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([5, 3])}, "ntokens": 8,
              "target_start": torch.tensor([1, 0]), "target_end": torch.tensor([3, 0])}
    loss, sample_size, log = crit(model, sample)
    start, end = model.span_heads["span_head"](model.features)
    expected = 0.0
    for row, n, (ts, te) in ((0, 5, (1, 3)), (1, 3, (0, 0))):  # softmax over the real tokens only
        expected += (-F.log_softmax(start[row, :n], -1)[ts] - F.log_softmax(end[row, :n], -1)[te]) / 2
    assert sample_size == 2 and loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert 0 <= log["span_correct"] <= min(log["start_correct"], log["end_correct"]) <= 2


# ---------------------------------------------------------------------------------------------
# end to end through the CLIs

MODEL = ["--arch", "roberta_pe_tiny", "--encoder-layers", "2", "--encoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2"]
TRAIN = ["--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8", "--cpu", "--num-workers", "0",
         "--no-epoch-checkpoints", "--log-format", "simple", "--seed", "1", "--user-dir", PLUGIN]


@pytest.mark.shared_data
@pytest.mark.parametrize("version,flags", [
    ("1.1", ["--pe-absolute", "learned"]),
    ("2.0", ["--pe-absolute", "none", "--pe-relative", "learned"]),
], ids=["v1.1-ape-learned", "v2.0-rpe-learned"])
def test_end_to_end_pretrain_128_finetune_and_predict_longer(spm_dict, tmp_path, capsys, version,
                                                             flags):
    """Pretrain a masked LM on 32-token blocks (positions 0..31), fine-tune and predict on 64-token
    features (the long-passage point, scaled down), then reload the checkpoint and predict again."""
    dev = spm_dict["dev"]
    make = subset if version == "1.1" else make_v2
    train_json = write_json(tmp_path / "train.json", make(dev, [0], 3, 3))
    valid_json = write_json(tmp_path / "valid.json", make(dev, [1], 2, 3))
    data = str(tmp_path / "squad-bin")
    out = cli("fairseq-pe-prepare-squad", "--train", train_json, "--valid", valid_json, "--spm-model",
              spm_dict["spm"], "--dict", spm_dict["dict"], "--destdir", data, "--max-length", "64", "--doc-stride",
              "24", "--max-query-length", "50").stdout
    assert f"SQuAD version {version}" in out and "windows per question" in out

    with forked():  # the trainings from the fork server, the tools fresh
        cli("fairseq-train", spm_dict["mono"], "--task", "masked_lm", "--criterion", "masked_lm",
            "--tokens-per-sample", "32", "--max-positions", "32", "--max-update", "3", "--save-dir",
            str(tmp_path / "mlm"), *MODEL, *flags, *TRAIN)
        ft = cli("fairseq-train", data, "--task", "span_prediction", "--criterion", "span_prediction",
                 "--max-positions", "64", "--max-update", "4", "--save-dir", str(tmp_path / "ft"), "--restore-file",
                 str(tmp_path / "mlm" / "checkpoint_last.pt"), "--reset-optimizer", "--reset-dataloader",
                 "--reset-meters", *MODEL, *flags, *TRAIN)
    log = ft.stdout + ft.stderr
    assert "Loaded checkpoint" in log and "new span head weights" in log
    assert "valid on 'valid' subset" in log and "span_acc" in log

    ckpt = str(tmp_path / "ft" / "checkpoint_last.pt")
    prefix = str(tmp_path / "pred" / "valid")
    pred = cli("fairseq-pe-squad-predict", data, "--path", ckpt, "--user-dir", PLUGIN, "--split", "valid",
               "--json", valid_json, "--out", prefix)
    assert f"SQuAD v{version} valid: EM" in pred.stdout
    with open(valid_json) as f:
        gold = json.load(f)
    qids = {qa["id"] for _, qa in squad.iter_questions(gold["data"])}
    with open(prefix + ".predictions.json") as f:
        predictions = json.load(f)
    with open(prefix + ".scores.json") as f:
        scores = json.load(f)
    assert set(predictions) == qids and all(isinstance(v, str) for v in predictions.values())
    assert 0 <= scores["exact_match"] <= 100 and 0 <= scores["f1"] <= 100
    assert scores["questions"] == len(qids) and scores["features"] > len(qids)  # several windows per question
    recomputed = squad.evaluate(gold["data"], predictions, version)
    assert scores["exact_match"] == pytest.approx(recomputed["exact_match"])
    assert scores["f1"] == pytest.approx(recomputed["f1"])
    if version == "2.0":
        assert scores["NoAns_total"] == 2 and scores["HasAns_total"] == len(qids) - 2
        assert os.path.isfile(prefix + ".null_odds.json")

    # reload: the checkpoint again, here in this process, gives the same answers and scores
    torch.set_num_threads(1)
    again = str(tmp_path / "pred2" / "valid")
    assert squad.main([data, "--path", ckpt, "--split", "valid", "--json", valid_json, "--out", again,
                       "--batch-size", "5"]) == 0
    with open(again + ".predictions.json") as f:
        assert json.load(f) == predictions
    with open(prefix + ".nbest.json") as f1, open(again + ".nbest.json") as f2:
        n1, n2 = json.load(f1), json.load(f2)
    for q in qids:
        assert [c["text"] for c in n1[q]] == [c["text"] for c in n2[q]]
        np.testing.assert_allclose([c["score"] for c in n1[q]], [c["score"] for c in n2[q]], rtol=1e-4, atol=1e-5)
    assert not any(math.isnan(c["score"]) for q in qids for c in n1[q])
    # refused: gold answers of another file; the v2.0 threshold on v1.1 data
    assert exit_status(squad.main, [data, "--path", ckpt, "--json", train_json, "--out", again, "--force"]) == 2
    assert "is not in --json" in capsys.readouterr().err
    if version == "1.1":
        assert exit_status(squad.main, [data, "--path", ckpt, "--json", valid_json, "--out", again, "--force",
                                        "--null-score-diff-threshold", "1"]) == 2
        assert "SQuAD 2.0 only" in capsys.readouterr().err


def test_outputs_of_an_earlier_run_or_inputs_are_never_replaced(tmp_path, capsys):
    """Issue 14, before any work: prepare-squad's --destdir and squad-predict's --out files of an
    earlier run need --force; an output that is an input is refused even with it."""
    for name in ("spm.model", "dict.txt", "model.pt", "dev.json"):
        (tmp_path / name).write_text("w 1\n" if name == "dict.txt" else "x")
    dest = tmp_path / "squad-bin"
    (dest / "input0").mkdir(parents=True)
    (dest / "prepare.json").write_text("{}")
    common = ["--valid", str(tmp_path / "dev.json"), "--spm-model", str(tmp_path / "spm.model"),
              "--dict", str(tmp_path / "dict.txt"), "--destdir", str(dest)]
    assert exit_status(prep.main, common) == 2
    err = capsys.readouterr().err
    assert f"error: --destdir {dest}: " in err and "prepare.json exists already" in err and "--force" in err
    assert (dest / "prepare.json").read_text() == "{}" and os.listdir(dest / "input0") == []
    # squad-predict: PREFIX.scores.json of an earlier run; PREFIX naming an input
    (tmp_path / "pred.scores.json").write_text("earlier")
    argv = [str(dest), "--path", str(tmp_path / "model.pt"), "--json", str(tmp_path / "dev.json")]
    assert exit_status(squad.main, argv + ["--out", str(tmp_path / "pred")]) == 2
    assert "pred.scores.json exists already" in capsys.readouterr().err
    assert (tmp_path / "pred.scores.json").read_text() == "earlier"
    (tmp_path / "gold.predictions.json").write_text("{}")
    argv[-1] = str(tmp_path / "gold.predictions.json")  # --json is where PREFIX.predictions.json would go
    assert exit_status(squad.main, argv + ["--out", str(tmp_path / "gold"), "--force"]) == 2
    assert "would write over the input --json" in capsys.readouterr().err
