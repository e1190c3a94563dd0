"""A checkpoint's options are data (issue 55, 1): fairseq's ``eval`` of option strings is a literal parse, and a
checkpoint whose evaluated options are not literals is refused by name before any model is built
(``fairseq_pe/compat/literal_options.py``).

The checkpoint is a real one (fairseq's Trainer after one update) whose ``cfg.model.xformers_att_config`` is a
string of code: it holds only allow-listed types, so the weights-only load takes it, and fairseq's
``MultiheadAttention`` ran it through ``utils.eval_str_dict`` while the model was built.

Every entry point of the issue is run: fairseq-generate, -interactive, -validate and -eval-lm, the hub,
``load_model_ensemble_and_task``, fairseq-pe-analyze, -warm-start-floater, -bucket-loss and -lm-lengths (the last
reporting its fairseq-eval-lm's refusal as its own one line).  A checkpoint that cannot become the command's model
(another kind of model, an override that adds weights, an architecture no registry holds) is one line too.

Mutations caught: the helpers left as fairseq's (``test_fairseqs_helpers_parse_literals``); the check left out of
the loader (every entry point of ``test_every_entry_point_refuses_code_in_an_option``: the marker file appears);
the check by a field list that misses the bare ``xformers_att_config`` (the checkpoint's field);
``FAIRSEQ_PE_SKIP_FIXES=literal_options`` shows stock fairseq running the code (the test's control).
"""

import argparse
import os

import pytest
import torch

from fairseq_pe.compat.literal_options import NotALiteral, check_options, literal_value
from fairseq_pe.safe_load import CheckpointRefused

from helpers import PLUGIN, assert_user_error, cli, exit_status, synthetic_data_bin
from training import TINY, batch, build_trainer


def test_literals_and_fairseqs_own_defaults_parse():
    assert literal_value("[(512, 3)] * 20") == [(512, 3)] * 20  # fconv's default encoder_layers
    assert literal_value("[(512, 3)] * 2 + [(1024, 3)]") == [(512, 3), (512, 3), (1024, 3)]
    assert literal_value("(0.9, 0.98)") == (0.9, 0.98)
    assert literal_value("10000,50000") == (10000, 50000)  # adaptive_softmax_cutoff
    assert literal_value(" True ") is True and literal_value("None") is None and literal_value("-1") == -1
    assert literal_value("{'dropout': 0.1, 'attention': 'scaled_dot_product'}")["dropout"] == 0.1


@pytest.mark.parametrize("code", ["__import__('os').system('true') or None", "open('x')", "().__class__",
                                  "[x for x in ()]", "lambda: 0", "[0] * 10 ** 9", "[0] * 1000000000", "(", ""])
def test_anything_else_is_not_a_literal(code):
    with pytest.raises(NotALiteral):
        literal_value(code)


def test_fairseqs_helpers_parse_literals(tmp_path):
    from fairseq import options, utils

    marker = tmp_path / "MARKER"
    code = f"open({str(marker)!r}, 'w').close() or None"
    for helper in (utils.eval_str_dict, utils.eval_str_list, utils.eval_bool, options.eval_str_list):
        with pytest.raises(NotALiteral):
            helper(code)
    assert not marker.exists()
    assert utils.eval_str_list("10000,50000", type=int) == [10000, 50000] and utils.eval_bool("False") is False
    assert utils.eval_str_dict(None) is None and utils.eval_str_list(3.0) == [3.0]


@pytest.mark.parametrize("field", ["xformers_att_config", "adaptive_softmax_cutoff", "adaptive_input_cutoff",
                                   "encoder_layers", "character_filters", "conv_feature_layers"])
def test_the_check_names_each_evaluated_field(field):
    code = "__import__('os').system('true')"
    for state in ({"args": argparse.Namespace(arch="fconv", **{field: code})},
                  {"cfg": {"model": argparse.Namespace(**{field: code}), "task": {}}},
                  {"cfg": {"model": {"decoder": {field: code}}}}):
        with pytest.raises(CheckpointRefused, match=rf"F\.pt: refused: its option \S*{field} = "):
            check_options(state, "F.pt")
    check_options({"args": argparse.Namespace(**{field: "[(512, 3)] * 2"})}, "F.pt")  # a literal: kept


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    """A data folder, and a real checkpoint whose cfg.model.xformers_att_config is code that creates MARKER."""
    root = tmp_path_factory.mktemp("literal_options")
    data = synthetic_data_bin(root, train_size=8, valid_size=2, test_buckets=[(2, 5)], test_per_bucket=2, seed=3)
    trainer = build_trainer(data, *TINY, "--pe-absolute", "sinusoidal")
    assert trainer.train_step([batch(trainer.task.source_dictionary, [5, 4], [4, 3])]) is not None
    trainer.consolidate_optimizer()
    good = str(root / "checkpoint_good.pt")
    trainer.save_checkpoint(good, {})
    marker = root / "MARKER"
    state = torch.load(good, weights_only=False)  # the test's own file
    model_cfg = state["cfg"]["model"]
    code = f"open({str(marker)!r}, 'w').close() or None"
    if isinstance(model_cfg, argparse.Namespace):
        model_cfg.xformers_att_config = code
    else:
        model_cfg["xformers_att_config"] = code
    torch.save(state, root / "checkpoint_evil.pt")
    lm = str(root / "lm")  # the source side as a language model's test split, for fairseq-eval-lm's doors
    cli("fairseq-preprocess", "--only-source", "--testpref", root / "raw" / "test.src", "--srcdict",
        os.path.join(data, "dict.src.txt"), "--destdir", lm, "--workers", "1")
    return {"data": data, "root": root, "good": good, "evil": str(root / "checkpoint_evil.pt"), "marker": marker,
            "lm": lm}


ENTRY_POINTS = ["fairseq-generate", "fairseq-interactive", "fairseq-validate", "fairseq-eval-lm", "hub",
                "load_model_ensemble", "fairseq-pe-analyze", "warm-start-floater", "fairseq-pe-bucket-loss",
                "fairseq-pe-lm-lengths"]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_refuses_code_in_an_option(entry, poisoned, capsys):
    data, evil, marker = poisoned["data"], poisoned["evil"], poisoned["marker"]
    field = "cfg.model.xformers_att_config"
    out = str(poisoned["root"] / f"out-{entry}")
    commands = {
        "fairseq-generate": [data, "--path", evil, "--beam", "1", "--gen-subset", "test"],
        "fairseq-interactive": [data, "--path", evil, "--beam", "1", "--input", "-"],
        "fairseq-validate": [data, "--task", "translation", "--path", evil, "--valid-subset", "test",
                             "--max-tokens", "1000"],
        "fairseq-eval-lm": [poisoned["lm"], "--path", evil, "--gen-subset", "test"],
        "fairseq-pe-bucket-loss": [data, "--system", f"evil={evil}", "--out", out, "--cpu"],
        "fairseq-pe-lm-lengths": ["--data", poisoned["lm"], "--checkpoint", f"evil={evil}", "--train-length", "8",
                                  "--out", out]}
    if entry in commands:
        plugin = [] if entry.startswith("fairseq-pe-") else ["--user-dir", PLUGIN, "--cpu"]
        proc = cli(entry, *commands[entry], *plugin, check=False)
        assert_user_error(proc, entry, field, "not a literal", evil)
    elif entry in ("hub", "load_model_ensemble"):
        from fairseq import checkpoint_utils
        from fairseq.models.transformer import TransformerModel

        with pytest.raises(CheckpointRefused, match=field):
            if entry == "hub":
                TransformerModel.from_pretrained(str(poisoned["root"]), checkpoint_file="checkpoint_evil.pt",
                                                 data_name_or_path=data)
            else:
                checkpoint_utils.load_model_ensemble_and_task([evil], arg_overrides={"data": data})
    else:
        from fairseq_pe.analysis import cli as analyze
        from fairseq_pe.warm_start import floater

        main, prog = (analyze.main, entry) if entry == "fairseq-pe-analyze" else \
            (floater.cli_main, "fairseq-pe-warm-start-floater")
        assert exit_status(main, [evil, out]) == 2 if main is floater.cli_main else \
            exit_status(main, [evil, "--out", out]) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith(f"{prog}: error: ") and field in last, last
    assert not marker.exists()


def test_stock_fairseq_runs_the_code_and_the_good_checkpoint_loads(poisoned):
    """The control: without the fix, fairseq-generate runs the option's code (the marker appears); the same
    checkpoint without the code loads through the fixed loader."""
    from fairseq import checkpoint_utils

    data, marker = poisoned["data"], poisoned["marker"]
    proc = cli("fairseq-generate", data, "--user-dir", PLUGIN, "--path", poisoned["evil"], "--cpu", "--beam", "1",
               "--gen-subset", "test", check=False)
    assert not marker.exists()
    env = dict(os.environ, FAIRSEQ_PE_SKIP_FIXES="literal_options")
    try:
        import subprocess
        import sys

        code = ("import sys, fairseq_pe; from fairseq import checkpoint_utils; "
                "checkpoint_utils.load_model_ensemble_and_task([sys.argv[1]], arg_overrides={'data': sys.argv[2]})")
        subprocess.run([sys.executable, "-c", code, poisoned["evil"], data], env=env, capture_output=True, timeout=300)
        assert marker.exists(), proc.stderr[-2000:]
    finally:
        marker.unlink(missing_ok=True)
    models, _ = checkpoint_utils.load_model_ensemble([poisoned["good"]], arg_overrides={"data": data})
    assert len(models) == 1


def _archive(path, members):
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_a_hub_archive_never_writes_outside_its_folder_nor_deletes_the_users_file(tmp_path, monkeypatch):
    """Issue 55, 2: before, a member ``../../escaped/PWNED.pth`` was written outside the temporary folder and the
    user's ``model.tar.gz`` was deleted and replaced by a folder."""
    from fairseq import file_utils

    from fairseq_pe.errors import UserError

    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(work))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(work))
    evil = _archive(tmp_path / "evil.tar.gz", {"model/checkpoint.pt": b"x", "../../escaped/PWNED.pth": b"import os"})
    with pytest.raises(UserError, match=r"evil\.tar\.gz: refused: its member '\.\./\.\./escaped/PWNED\.pth'"):
        file_utils.load_archive_file(evil)
    assert not list(tmp_path.rglob("PWNED.pth")) and os.path.isfile(evil)
    good = _archive(tmp_path / "model.tar.gz", {"model/checkpoint.pt": b"x", "model/dict.src.txt": b"w 1\n"})
    folder = file_utils.load_archive_file(good)
    assert os.path.isfile(good) and sorted(os.listdir(folder)) == ["checkpoint.pt", "dict.src.txt"]


@pytest.mark.parametrize("flags, overrides, message", [
    ([], {"pe_attention_kernel": "bogus"}, "--pe-attention-kernel must be one of auto, sdpa, blockwise, flex, got "
                                           "'bogus'"),
    ([], {"pe_attention_kernel": 5}, "--pe-attention-kernel must be one of auto, sdpa, blockwise, flex, got 5"),
    (["--pe-relative", "learned"], {"pe_relative_max_distance": "five"},
     "--pe-relative-max-distance: an integer is needed, got 'five'"),
    (["--pe-relative", "fox"], {"pe_fox_gate_bias": float("inf")}, "--pe-fox-gate-bias must be finite, got inf"),
    (["--pe-relative", "alibi", "--pe-dape", "v2", "--pe-dape-kernel", "100001"],
     {}, r"--pe-dape-kernel 100,001 is wider than any row of keys can use: at most 2 × the longest length"),
    (["--pe-relative", "cope", "--pe-cope-npos", "100000000000"], {},
     "--pe-cope-npos 100,000,000,000 has more rows than contextual positions can reach"),
    (["--pe-relative", "fox", "--pe-fox-gate-std", "1e30"], {}, "--pe-fox-gate-std must be from 0 to 10"),
    (["--pe-relative", "fox", "--pe-fox-gate-std", "nan"], {}, "--pe-fox-gate-std must be from 0 to 10"),
])
def test_every_position_option_is_held_to_its_schema_and_its_cost_bound(flags, overrides, message):
    """Issue 55, 5: values that argparse would refuse, arriving through ``--model-overrides`` (or a YAML file), and
    sizes with a hidden cost: before, a bogus kernel was used as ``auto``, ``--pe-dape-kernel 100001`` ran for 600 s
    in its first update, ``--pe-cope-npos 1e11`` asked for 12.8 TB and ``--pe-fox-gate-std 1e30`` gave NaN."""
    from fairseq_pe.errors import UserError

    from helpers import build_model

    with pytest.raises(UserError, match=message):
        build_model("--pe-absolute", "none", *flags, overrides=overrides)


def test_a_bogus_override_is_one_line_from_fairseq_generate(poisoned):
    proc = cli("fairseq-generate", poisoned["data"], "--user-dir", PLUGIN, "--path", poisoned["good"], "--cpu",
               "--beam", "1", "--gen-subset", "test", "--model-overrides", "{'pe_attention_kernel': 'bogus'}",
               check=False)
    assert_user_error(proc, "fairseq-generate", "--pe-attention-kernel must be one of", "'bogus'")


@pytest.mark.parametrize("content", ["tensor", "no-model", "empty", "random", "folder", "no-ema"])
def test_files_that_are_no_checkpoint_are_one_line_for_every_loader(content, poisoned, tmp_path):
    """Issue 55, 6: a bare tensor, a dict without ``model`` (``KeyError: 'best_loss'``), an empty or random file,
    a folder, and for ``--ema-seed-model`` a checkpoint without EMA (``KeyError: 'ema'``): tracebacks before."""
    from fairseq import checkpoint_utils

    from fairseq_pe.errors import UserError

    path = tmp_path / "f.pt"
    if content == "tensor":
        torch.save(torch.zeros(3), path)
    elif content == "no-model":
        torch.save({"cfg": None, "weights": {}}, path)
    elif content == "empty":
        path.write_bytes(b"")
    elif content == "random":
        path.write_bytes(os.urandom(4096))
    elif content == "folder":
        path.mkdir()
    else:
        path = poisoned["good"]  # trained without --store-ema
    if content != "no-ema":
        with pytest.raises(UserError, match=f"checkpoint {path}"):
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
    with pytest.raises(UserError, match=f"--ema-seed-model {path}"):
        checkpoint_utils.load_ema_from_checkpoint(str(path))


def _with_architecture(state_path, out, name, old_format):
    state = torch.load(state_path, weights_only=False)  # the test's own file
    model = state["cfg"]["model"]
    model.arch, model._name = name, name
    if old_format:  # fairseq's format before its dataclasses: the options in "args", no "cfg"
        state["args"], state["cfg"] = model, None
    torch.save(state, out)
    return str(out)


@pytest.mark.parametrize("case", ["translation-to-eval-lm", "override-adds-weights", "unknown-arch-cfg",
                                  "unknown-arch-args"])
def test_a_checkpoint_that_cannot_become_the_commands_model_is_one_line(case, poisoned, tmp_path):
    """Issue 55, 6: a translation checkpoint given to fairseq-eval-lm (``AttributeError: supported_targets``), an
    override that adds parameters (torch's "Missing key(s)" over several lines), an architecture no registry holds
    (``IndexError`` in fairseq's own message, or ``KeyError`` from the old format)."""
    data, good = poisoned["data"], poisoned["good"]
    if case == "translation-to-eval-lm":
        proc = cli("fairseq-eval-lm", poisoned["lm"], "--path", good, "--user-dir", PLUGIN, "--cpu", "--gen-subset",
                   "test", check=False)
        assert_user_error(proc, "fairseq-eval-lm", "the checkpoint's model is transformer_pe, an encoder-decoder",
                          "fairseq-generate")
        return
    if case == "override-adds-weights":
        path, extra = good, ["--model-overrides", "{'pe_relative': 'kerple-log'}"]
        expected = ["its weights do not fit the model", "weights the file lacks",
                    "--model-overrides {'pe_relative': 'kerple-log'} changes which weights the model has"]
    else:
        path = _with_architecture(good, tmp_path / "arch.pt", "no_such_arch", old_format=case.endswith("args"))
        extra = []
        expected = [f"checkpoint {path}: its model architecture 'no_such_arch'",
                    "args.arch" if case.endswith("args") else "cfg.model._name", "--user-dir"]
    proc = cli("fairseq-generate", data, "--user-dir", PLUGIN, "--path", path, "--cpu", "--beam", "1",
               "--gen-subset", "test", *extra, check=False)
    assert_user_error(proc, "fairseq-generate", *expected)


def test_a_checkpoint_of_an_unknown_architecture_still_averages(poisoned, tmp_path):
    """The architecture is checked where a model is built: a checkpoint that is only read keeps loading."""
    from fairseq import checkpoint_utils

    path = _with_architecture(poisoned["good"], tmp_path / "arch.pt", "no_such_arch", old_format=False)
    assert checkpoint_utils.load_checkpoint_to_cpu(path)["model"]
