"""fairseq-pe-analyze on position tables without their model (issue 19): raw ``.npy``/``.pt`` tables
and Hugging Face model folders (BERT, RoBERTa, GPT-2 built here from tiny configurations, nothing
downloaded).

The table read must be the model's own, row for row (RoBERTa's from row pad_token_id + 1 = 2, also
under a task head's prefix, sharded, and from pytorch_model.bin); the command must write the
analyses of absolute vectors (property scores, probe, pictures) and say what it skipped; a
sinusoidal table must score as translation invariant and monotone where a random one does not; and
bad input gets one clear error naming the file or flag, with nothing written.
"""

import json
import os
import re
import sys

import numpy as np
import pytest
import torch

from fairseq_pe.analysis.checkpoint import save_untrained_checkpoint
from fairseq_pe.analysis.properties import proximity
from fairseq_pe.analysis.report import analyze_table
from fairseq_pe.analysis.inputs import load_position_table
from fairseq_pe.analysis.tables import TableError
from fairseq_pe.positional.sinusoidal import transformer_frequencies

from helpers import analyze_in_process, assert_pictures_and_reports, assert_user_error, cli

SMALL = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
             max_position_embeddings=40)
PER_TABLE = {"report.md", "scores.json", "matrices.npz", "absolute.png", "profiles.png", "probe.png", "norms.png"}
SKIPPED = {"identical_word", "relative", "frequencies"}
FIRST_POSITION_ROW = {"bert": 0, "roberta": 2, "gpt2": 0}  # RoBERTa: pad_token_id 1, positions from row 2


@pytest.fixture(scope="module")
def transformers():
    """transformers, its models importable.  It imports torchaudio whenever one is installed, and the
    lock's torchaudio (2.11, a CUDA wheel) cannot load beside a CPU torch 2.13: such a torchaudio is
    hidden from it here.  The analysis itself never imports transformers' models."""
    with pytest.MonkeyPatch.context() as mp:
        try:
            import torchaudio  # noqa: F401
        except Exception:  # noqa: BLE001  (OSError: a library it needs is missing)
            mp.setitem(sys.modules, "torchaudio", None)
        import transformers

        yield transformers


@pytest.fixture(scope="module")
def models(transformers, tmp_path_factory):
    """name -> (model, its save_pretrained folder)."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    built = {"bert": transformers.BertModel(transformers.BertConfig(**SMALL)),
             "roberta": transformers.RobertaModel(transformers.RobertaConfig(**SMALL)),
             "gpt2": transformers.GPT2Model(transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2,
                                                                    n_positions=40, bos_token_id=0, eos_token_id=0))}
    assert built["roberta"].config.pad_token_id == 1
    out = {}
    for name, model in built.items():
        model.save_pretrained(root / name)
        out[name] = (model, str(root / name))
    return out


def position_rows(model, name: str) -> torch.Tensor:
    """The model's position table from the row of position 0 on, as stored."""
    weight = model.wpe.weight if name == "gpt2" else model.embeddings.position_embeddings.weight
    return weight.detach()[FIRST_POSITION_ROW[name]:].double()


def sinusoids(positions: int, dim: int) -> torch.Tensor:
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * transformer_frequencies(dim).double()[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def test_tables_are_read_exactly(models, transformers, tmp_path):
    for name, (model, folder) in models.items():
        table = load_position_table(folder)
        assert table.kind == "huggingface" and table.model_type == name
        assert torch.equal(table.vectors, position_rows(model, name)), name
    roberta = load_position_table(models["roberta"][1])
    stored = models["roberta"][0].embeddings.position_embeddings.weight.detach()
    assert roberta.vectors.shape == (38, 16) and roberta.dropped_rows == 2 and not stored[1].any()  # the padding row
    assert "pad_token_id + 1 = 2" in roberta.note and roberta.source == "embeddings.position_embeddings.weight"

    # under a task head's prefix (bert.), sharded; and as pytorch_model.bin
    mlm = transformers.BertForMaskedLM(transformers.BertConfig(**SMALL))
    mlm.save_pretrained(tmp_path / "mlm", max_shard_size="4KB")
    assert (tmp_path / "mlm" / "model.safetensors.index.json").is_file()
    table = load_position_table(str(tmp_path / "mlm"))
    assert table.source == "bert.embeddings.position_embeddings.weight"
    assert torch.equal(table.vectors, mlm.bert.embeddings.position_embeddings.weight.detach().double())
    gpt2 = models["gpt2"][0]
    (tmp_path / "bin").mkdir()
    gpt2.config.save_pretrained(tmp_path / "bin")
    torch.save(gpt2.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    assert torch.equal(load_position_table(str(tmp_path / "bin")).vectors, position_rows(gpt2, "gpt2"))

    # a table the model computes: DistilBERT's sinusoids, exactly translation invariant
    distil = transformers.DistilBertModel(transformers.DistilBertConfig(
        vocab_size=50, dim=16, n_layers=1, n_heads=2, hidden_dim=32, max_position_embeddings=40,
        sinusoidal_pos_embds=True))
    distil.save_pretrained(tmp_path / "distil")
    table = load_position_table(str(tmp_path / "distil"))
    assert table.description == "sinusoidal APE (Hugging Face distilbert)"
    assert analyze_table(table, "distil").scores["absolute"]["1"]["dot"]["translation_invariance"] < 1e-6
    learned = analyze_table(load_position_table(models["bert"][1]), "bert")
    assert learned.scores["absolute"]["1"]["dot"]["translation_invariance"] > 0.3


def test_command_on_hugging_face_folders_and_raw_tables(models, tmp_path):
    sinusoidal, random = tmp_path / "sinusoidal.npy", tmp_path / "random.pt"
    np.save(sinusoidal, sinusoids(64, 32).numpy())
    torch.save(torch.randn(64, 32, generator=torch.Generator().manual_seed(0)), random)
    out = tmp_path / "out"
    inputs = [models[n][1] for n in ("bert", "roberta", "gpt2")] + [str(sinusoidal), str(random)]
    proc = cli("fairseq-pe-analyze", *inputs, "--out", str(out))
    names = ["bert", "roberta", "gpt2", "sinusoidal", "random"]
    table = (out / "properties.md").read_text()
    assert table in proc.stdout
    assert {p.name for p in out.iterdir()} == set(names) | {"properties.md", "properties.json", "report.md",
                                                            "absolute.png", "norms.png"}
    for name in names:
        assert {p.name for p in (out / name).iterdir()} == PER_TABLE, name
    assert_pictures_and_reports(out)

    # what was skipped, and why: in each report.md and scores.json, and once in properties.md
    assert "Identical-word probing" not in table
    assert re.search(r"^Not analysed for bert, roberta, gpt2, sinusoidal, random \(position tables without their "
                     r"model\): identical-word probing needs a model's first attention layer", table, re.M)
    report = (out / "roberta" / "report.md").read_text()
    assert "## Not analysed" in report and "- identical-word probing needs" in report
    assert "rows 0..1 of embeddings.position_embeddings.weight dropped" in report

    for name in ("bert", "roberta", "gpt2"):
        model, folder = models[name]
        s = json.loads((out / name / "scores.json").read_text())
        rows = position_rows(model, name)
        assert s["input"] == "huggingface" and s["checkpoint"] == os.path.abspath(folder)
        assert set(s["skipped"]) == SKIPPED and s["identical_word"] is None and s["relative"] is None
        assert s["position_limit"] == s["length"] == s["probe_length"] == len(rows) == (38 if name == "roberta" else 40)
        absolute = s["absolute"]["1"]
        assert set(absolute["dot"]) >= {"translation_invariance", "window_right", "window_left", "eq2_share"}
        assert len(absolute["probe"]["errors"]) == len(rows) // 2 and absolute["probe"]["mean_abs_error"] > 0
        np.testing.assert_allclose(absolute["norms"], rows.norm(dim=-1).numpy(), rtol=1e-5)
        with np.load(out / name / "matrices.npz") as saved:  # the matrices are those of the model's own rows
            assert set(saved.files) == {"absolute_dot_block1", "absolute_cosine_block1"}
            np.testing.assert_array_equal(saved["absolute_dot_block1"], proximity(rows).numpy())

    summary = {r["name"]: r for r in json.loads((out / "properties.json").read_text())}
    assert summary["sinusoidal"]["input"] == "table"
    assert summary["sinusoidal"]["skipped"] == ["identical_word", "relative", "frequencies"]
    sin, rnd = summary["sinusoidal"], summary["random"]
    # sinusoids: ⟨p_x, p_y⟩ = ψ(x − y), exactly translation invariant, decreasing over the first offsets,
    # and every position recovered by the linear probe; a random table has none of it
    assert sin["absolute.translation_invariance"] < 1e-9 < 0.5 < rnd["absolute.translation_invariance"]
    assert sin["absolute.eq2_share"] > 0.8 > 0.6 > rnd["absolute.eq2_share"]
    assert sin["absolute.window_right"] > rnd["absolute.window_right"]
    assert sin["probe.exact_share"] == 1.0 and rnd["probe.exact_share"] < 0.2 and rnd["probe.mean_abs_error"] > 5
    assert re.search(r"^\| sinusoidal \| position table \(\.npy\) \|", table, re.M)
    assert re.search(r"^\| random \| position table \(\.pt\) \|", table, re.M)

    # an earlier analysis is replaced only with --force
    again = cli("fairseq-pe-analyze", str(sinusoidal), "--out", str(out), check=False)
    assert_user_error(again, "fairseq-pe-analyze", "exist already", "pass --force")


def write(path, content):
    """``content``: an array (.npy), a tensor or dict (.pt), text, or None for an empty folder."""
    if content is None:
        path.mkdir()
    elif isinstance(content, str):
        path.write_text(content)
    elif path.suffix == ".npy":
        np.save(path, content)
    else:
        torch.save(content, path)
    return path


@pytest.mark.parametrize("filename, content, flags, fragments", [
    ("line.npy", np.zeros(10), (), ["the NumPy array is 1-D, of shape (10,); a position table is 2-D"]),
    ("cube.pt", torch.zeros(2, 8, 4), (), ["the tensor is 3-D, of shape (2, 8, 4); a position table is 2-D"]),
    ("two.pt", {"a": torch.zeros(8, 4), "b": torch.zeros(8, 4)}, (), ["a dict of 2 entries ('a', 'b')"]),
    ("short.npy", np.zeros((3, 4)), (), ["shape (3, 4): a position table needs at least 4 positions"]),
    ("nan.npy", np.full((8, 4), np.nan), (), ["holds NaN or infinite values"]),
    ("words.npy", np.array([["a", "b"]] * 8), (), ["holds <U1 values, not real numbers"]),
    ("empty", None, (), ["a folder without config.json, so not a Hugging Face model folder"]),
    ("notes.txt", "hello", (), ["cannot be read as a fairseq checkpoint", "nor as a position table"]),
    ("ok.npy", np.ones((8, 4)), ("--side", "decoder"), ["--side decoder applies to fairseq checkpoints only"]),
    ("ok.npy", np.ones((8, 4)), ("--num-tokens", "5"), ["--num-tokens applies to fairseq checkpoints only"]),
    ("ok.npy", np.ones((8, 4)), ("--seed", "1"), ["--seed applies to fairseq checkpoints only"]),
    ("ok.npy", np.ones((8, 4)), ("--user-dir", "."), ["--user-dir applies to fairseq checkpoints only"]),
    ("ok.npy", np.ones((8, 4)), ("--length", "9"), ["--length 9, but its position table holds only 8 positions"]),
])
def test_bad_input_is_one_clear_error(tmp_path, capsys, filename, content, flags, fragments):
    path = write(tmp_path / filename, content)
    code, err = analyze_in_process(capsys, path, "--out", tmp_path / "out", *flags)
    assert code == 2 and err.startswith("fairseq-pe-analyze: error: "), err
    assert str(path) in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert not (tmp_path / "out").exists()


def test_bad_table_through_the_console_script(tmp_path):
    path = write(tmp_path / "line.npy", np.zeros(10))
    proc = cli("fairseq-pe-analyze", str(path), "--out", str(tmp_path / "out"), check=False)
    assert_user_error(proc, "fairseq-pe-analyze", f"{path}: the NumPy array is 1-D")
    assert not (tmp_path / "out").exists()


def test_hugging_face_folders_that_cannot_be_analysed(models, transformers, tmp_path, monkeypatch):
    llama = tmp_path / "llama"  # RoPE: no table
    transformers.LlamaModel(transformers.LlamaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, num_key_value_heads=2,
                                                     intermediate_size=32)).save_pretrained(llama)
    with pytest.raises(TableError, match=re.escape(f"{llama}: a Hugging Face 'llama' model, which has no position "
                                                   "table to analyse; supported are") + ".*bert.*gpt2.*roberta"):
        load_position_table(str(llama))
    relative = tmp_path / "relative"  # a BERT whose table is not added to the words
    relative.mkdir()
    with open(os.path.join(models["bert"][1], "config.json")) as f:
        config = json.load(f)
    (relative / "config.json").write_text(json.dumps(dict(config, position_embedding_type="relative_key")))
    with pytest.raises(TableError, match=re.escape(f"{relative}: its config.json says position_embedding_type "
                                                   "'relative_key'")):
        load_position_table(str(relative))
    no_weights = tmp_path / "config-only"
    no_weights.mkdir()
    (no_weights / "config.json").write_text(json.dumps(config))
    with pytest.raises(TableError, match=re.escape(f"{no_weights}: no PyTorch weights")):
        load_position_table(str(no_weights))
    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed
    with pytest.raises(TableError, match=re.escape(f"{models['bert'][1]}: a Hugging Face model folder (it has "
                                                   "config.json); reading it needs transformers: "
                                                   "pip install 'fairseq-pe[hf]'")):
        load_position_table(models["bert"][1])


def test_a_checkpoint_and_a_table_in_one_run(tmp_path, capsys):
    checkpoint = tmp_path / "learned" / "checkpoint.pt"
    checkpoint.parent.mkdir()
    save_untrained_checkpoint(str(checkpoint), "transformer_pe_tiny", ["--pe-absolute", "learned"], vocab=40,
                              max_positions=32)
    table = write(tmp_path / "sinusoidal.npy", sinusoids(32, 16).numpy())
    out = tmp_path / "out"
    # options of checkpoints are fine beside a table; --side decoder is not (checked before any analysis)
    code, err = analyze_in_process(capsys, checkpoint, table, "--out", out, "--side", "decoder")
    assert code == 2 and f"--side decoder: {table} is a position table, which has no decoder" in err
    assert not out.exists()
    assert analyze_in_process(capsys, checkpoint, table, "--out", out, "--num-tokens", "5", "--seed", "1", "--length",
                              "16", "--quiet") == (0, "")
    ckpt, tab = (json.loads((out / n / "scores.json").read_text()) for n in ("learned", "sinusoidal"))
    assert ckpt["input"] == "checkpoint" and ckpt["skipped"] == {} and ckpt["num_tokens"] == 5
    assert tab["input"] == "table" and set(tab["skipped"]) == SKIPPED and tab["length"] == 16
    assert "identical-word.png" in {p.name for p in (out / "learned").iterdir()}
    assert (out / "identical-word.png").is_file() and (out / "absolute.png").is_file()
    properties = (out / "properties.md").read_text()
    probed = properties.split("\n\n")[1]  # the identical-word table: the checkpoint only
    assert "| learned |" in probed and "| sinusoidal |" not in probed
    assert "| sinusoidal | position table (.npy) |" in properties and "Not analysed for sinusoidal " in properties


def test_a_model_folder_never_runs_code_nor_reads_outside_itself(models, tmp_path):
    """Issue 55, 7: a folder whose config.json has ``auto_map`` asked "run the custom code? [y/N]" (and ran it on
    y); a sharded index could name a file outside the folder; a pickle payload in ``pytorch_model.bin`` was refused
    with torch's text, which suggests ``weights_only=False``.  Each is now one line, and nothing runs."""
    import shutil

    from fairseq_pe.analysis.tables import TableError

    remote = tmp_path / "remote"
    shutil.copytree(models["bert"][1], remote)
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    (remote / "config.json").write_text(json.dumps(config))
    with pytest.raises(TableError, match="refused: its config.json names code of its own to run"):
        load_position_table(str(remote))

    escape = tmp_path / "escape"
    shutil.copytree(models["bert"][1], escape)
    (escape / "model.safetensors").rename(tmp_path / "outside.safetensors")
    (escape / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"embeddings.position_embeddings.weight": "../outside.safetensors"}}))
    with pytest.raises(TableError, match=r"refused: its model.safetensors.index.json names '\.\./outside"):
        load_position_table(str(escape))

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'MARKER'}",)

    payload = tmp_path / "payload"
    shutil.copytree(models["bert"][1], payload)
    (payload / "model.safetensors").unlink()
    torch.save({"embeddings.position_embeddings.weight": torch.zeros(2, 2), "x": Payload()},
               payload / "pytorch_model.bin")
    with pytest.raises(TableError, match="refused: its weights' pickle needs") as refused:
        load_position_table(str(payload))
    assert "weights_only=False" not in str(refused.value) and not (tmp_path / "MARKER").exists()
