"""Bad input gets one clear message naming the flag or file, and exit status 2, never a traceback.

* Options: an explicit value is never replaced by a default (``--pe-t5-num-buckets 0`` used to
  train with 32 buckets), every out-of-range value is refused with its flag and allowed range,
  and options that would change nothing are refused.
* Through the real CLIs (``fairseq-train`` / ``fairseq-generate --user-dir fairseq_pe``): a bad
  ``--pe-*`` value, a missing or corrupt checkpoint and a sentence longer than a learned table
  end with ``PROG: error: ...`` on stderr and status 2; real bugs keep their tracebacks.
"""

import os
import re
import sys

import pytest
import torch

from fairseq_pe.errors import UserError
from fairseq_pe.positional.t5_bias import t5_bucket

from helpers import PLUGIN, assert_user_error, build_model, cli, random_tokens, synthetic_data_bin


@pytest.mark.parametrize("flags,message", [
    (("--pe-relative", "t5", "--pe-t5-num-buckets", "0"), "--pe-t5-num-buckets must be at least 4, got 0"),
    (("--pe-relative", "t5", "--pe-t5-num-buckets", "6", "--pe-t5-max-distance", "0"),
     "--pe-t5-max-distance must be at least 1, got 0"),
    (("--pe-relative", "learned", "--pe-relative-max-distance", "0"), "--pe-relative-max-distance must be at least 1"),
    (("--pe-relative", "sinusoidal", "--pe-relative-max-distance", "-3"), "--pe-relative-max-distance must be at least 1"),
    (("--pe-relative", "t5", "--pe-t5-num-buckets", "10"), "even number of at least 4"),  # 10 is fine; 9 is not
    (("--pe-absolute", "floater", "--pe-floater-hidden-dim", "0"), "--pe-floater-hidden-dim must be at least 1"),
    (("--pe-absolute", "floater", "--pe-floater-dynamics", "gru", "--pe-floater-rnn-layers", "0"),
     "--pe-floater-rnn-layers must be at least 1"),
    (("--pe-absolute", "floater", "--pe-floater-refresh-updates", "0"), "--pe-floater-refresh-updates must be at least 1"),
    (("--pe-absolute", "floater", "--pe-floater-solver", "dopri5", "--pe-floater-rtol", "0"),
     "--pe-floater-rtol must be positive"),
    (("--pe-absolute", "floater", "--pe-floater-dt", "0"), "--pe-floater-dt must be positive"),
    (("--pe-absolute", "floater", "--pe-floater-lr-scale", "0"), "--pe-floater-lr-scale must be positive"),
])
def test_explicit_values_are_checked_not_replaced(flags, message):
    if flags[-1] == "10":  # the control: an allowed even value is used as given
        model, _ = build_model(*flags)
        assert model.encoder.embed_positions.relative.num_buckets == 10
        with pytest.raises(UserError, match=message):
            build_model(*flags[:-1], "9")
        return
    with pytest.raises(UserError, match=message):
        build_model(*flags)


@pytest.mark.parametrize("max_distance,side", [(16, "decoder"), (12, "decoder"), (8, "encoder"), (3, "encoder")])
def test_t5_max_distance_must_exceed_the_exact_buckets(max_distance, side):
    # 32 buckets: 8 exact distances per direction in the encoder, 16 in the decoder
    with pytest.raises(UserError, match=rf"--pe-t5-max-distance must be greater than {8 if side == 'encoder' else 16}"
                                        rf".*{side}"):
        build_model("--pe-relative", "t5", "--pe-t5-max-distance", str(max_distance))


@pytest.mark.parametrize("num_buckets", [8, 32])
def test_t5_smallest_allowed_max_distance_keeps_buckets_in_range(num_buckets):
    max_distance = num_buckets // 2 + 1  # the smallest the decoder allows
    model, _ = build_model("--pe-relative", "t5", "--pe-t5-num-buckets", str(num_buckets),
                           "--pe-t5-max-distance", str(max_distance))
    distances = torch.arange(-5000, 5001)
    for causal in (False, True):
        buckets = t5_bucket(distances, not causal, num_buckets, max_distance)
        assert buckets.min() >= 0 and buckets.max() == num_buckets - 1
    assert model.decoder.embed_positions.relative.max_distance == max_distance


@pytest.mark.parametrize("flags,message", [
    (("--pe-relative", "rope", "--pe-relative-untie-layers"), "--pe-relative-untie-layers has no effect with --pe-relative rope"),
    (("--pe-relative", "rope", "--pe-relative-untie-heads"), "--pe-relative-untie-heads has no effect with --pe-relative rope"),
    (("--pe-relative", "alibi", "--pe-relative-untie-layers"), "--pe-relative-untie-layers has no effect with --pe-relative alibi"),
    (("--pe-relative", "alibi", "--pe-relative-untie-heads"), "--pe-relative-untie-heads has no effect with --pe-relative alibi"),
    (("--pe-relative", "sinusoidal", "--pe-relative-untie-layers"), "no effect"),
    (("--pe-absolute", "floater", "--pe-floater-dynamics", "gru", "--pe-floater-rnn-input", "vector",
      "--pe-floater-dt", "0.5"), "--pe-floater-dt has no effect with --pe-floater-rnn-input vector"),
    (("--pe-absolute", "floater", "--pe-floater-freeze-dynamics", "--pe-floater-lr-scale", "10"),
     "--pe-floater-lr-scale has no effect with --pe-floater-freeze-dynamics"),
    (("--pe-floater-bias", "--cross-self-attention"), "--cross-self-attention is not supported with --pe-floater-bias"),
    (("--pe-relative", "alibi", "--cross-self-attention"), "--cross-self-attention is not supported with --pe-relative"),
])
def test_options_that_change_nothing_or_cannot_work_are_refused(flags, message):
    with pytest.raises(UserError, match=message):
        build_model(*flags)


def test_options_that_do_change_something_are_accepted():
    model, _ = build_model("--pe-relative", "t5", "--pe-relative-untie-layers")
    assert model.encoder.embed_positions.relative.bias.shape[0] == 2
    model, _ = build_model("--pe-absolute", "floater", "--pe-floater-dynamics", "gru", "--pe-floater-dt", "0.5")
    assert model.floater.dt == 0.5


# ---- through the CLIs -------------------------------------------------------------------------

TRAIN = ["--arch", "transformer_pe_tiny", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "500",
         "--max-update", "2", "--no-epoch-checkpoints", "--cpu", "--num-workers", "0", "--log-format", "simple",
         "--share-all-embeddings", "--disable-validation"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return synthetic_data_bin(tmp_path_factory.mktemp("corpus"), train_size=100, valid_size=10,
                              test_buckets=[(1, 6), (20, 30)], test_per_bucket=4, seed=3)


@pytest.mark.parametrize("flags,fragments", [
    (("--pe-relative", "t5", "--pe-t5-num-buckets", "0"), ("--pe-t5-num-buckets must be at least 4, got 0",)),
    (("--pe-relative", "t5", "--pe-t5-max-distance", "16"), ("--pe-t5-max-distance must be greater than 16",
                                                             "allowed: 17 or more")),
    (("--pe-relative", "rope", "--pe-relative-untie-heads"), ("--pe-relative-untie-heads has no effect",)),
    (("--pe-absolute", "learned", "--pe-sinusoid-scale", "0.5"),
     ("--pe-sinusoid-scale applies to --pe-absolute sinusoidal / learnable-sinusoidal / sinusoidal-fairseq only",)),
    # issue 55, 6: an ImportError (no fairscale) or "Torch not compiled with CUDA enabled" before
    (("--ddp-backend", "fully_sharded"), ("--ddp-backend fully_sharded", "CUDA GPUs only", "(--cpu is given)")),
])
def test_fairseq_train_reports_a_bad_option_in_one_line(data_bin, tmp_path, flags, fragments):
    proc = cli("fairseq-train", data_bin, "--user-dir", PLUGIN, *TRAIN, "--save-dir", str(tmp_path), *flags,
               check=False)
    assert_user_error(proc, "fairseq-train", *fragments)
    assert not os.listdir(tmp_path)  # nothing trained, nothing written


def test_a_run_without_a_batch_size_is_one_line(data_bin, short_table_checkpoint, tmp_path):
    """fairseq-train and fairseq-validate without --max-tokens or --batch-size: fairseq's main asserted ("Must
    specify batch size ...", a traceback); now one line before anything is written (compat/run_checks.py)."""
    no_batch = [w for w in TRAIN if w not in ("--max-tokens", "500")]
    proc = cli("fairseq-train", data_bin, "--user-dir", PLUGIN, *no_batch, "--save-dir", tmp_path / "ck", check=False)
    assert_user_error(proc, "fairseq-train", "give --max-tokens", "or --batch-size")
    assert not (tmp_path / "ck").exists()
    proc = cli("fairseq-validate", data_bin, "--user-dir", PLUGIN, "--task", "translation", "--path",
               short_table_checkpoint, "--cpu", "--valid-subset", "valid", check=False)
    assert_user_error(proc, "fairseq-validate", "give --max-tokens", "or --batch-size")


@pytest.fixture(scope="module")
def short_table_checkpoint(data_bin, tmp_path_factory):
    """A learned APE of 12 rows: the test set's long sentences (20-30 words) do not fit."""
    save = tmp_path_factory.mktemp("ckpt")
    cli("fairseq-train", data_bin, "--user-dir", PLUGIN, *TRAIN, "--save-dir", str(save), "--pe-absolute", "learned",
        "--max-source-positions", "12", "--max-target-positions", "12", "--skip-invalid-size-inputs-valid-test")
    return str(save / "checkpoint_last.pt")


def generate(data_bin, path, *extra, env=None):
    cmd = ["fairseq-generate", data_bin, "--user-dir", PLUGIN, "--path", path, "--gen-subset", "test",
           "--beam", "1", "--max-tokens", "2000", "--cpu", *extra]
    if env is None:
        return cli(*cmd, check=False)
    import subprocess

    return subprocess.run(cmd, env=dict(os.environ, **env), capture_output=True, text=True)


def test_fairseq_generate_reports_a_sentence_longer_than_the_learned_table(data_bin, short_table_checkpoint):
    proc = generate(data_bin, short_table_checkpoint)
    assert_user_error(proc, "fairseq-generate", "Size of sample", "--max-source-positions")


def test_fairseq_generate_reports_missing_and_corrupt_checkpoints(data_bin, short_table_checkpoint, tmp_path):
    missing = str(tmp_path / "nope.pt")
    assert_user_error(generate(data_bin, missing), "fairseq-generate", f"--path {missing}: no such checkpoint file")
    truncated = tmp_path / "truncated.pt"
    with open(short_table_checkpoint, "rb") as f:
        truncated.write_bytes(f.read()[:5000])
    assert_user_error(generate(data_bin, str(truncated)), "fairseq-generate", str(truncated), "cannot be read")
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint\n")
    assert_user_error(generate(data_bin, str(text)), "fairseq-generate", str(text), "cannot be read")
    # FAIRSEQ_PE_TRACEBACK=1 shows the traceback of a user error, for debugging
    proc = generate(data_bin, missing, env={"FAIRSEQ_PE_TRACEBACK": "1"})
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "UserError" in proc.stderr


def test_import_leaves_sys_excepthook_alone_and_a_script_keeps_its_traceback(tmp_path):
    """``import fairseq_pe`` (with fairseq) changes no process-wide hook: in a script a user error is an ordinary
    exception (traceback, status 1), and so is a real bug."""
    import subprocess

    script = tmp_path / "bug.py"
    script.write_text("import sys\nhook = sys.excepthook\nimport fairseq, fairseq_pe\n"
                      "assert sys.excepthook is hook, sys.excepthook\nraise RuntimeError('a bug')\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "RuntimeError: a bug" in proc.stderr, proc.stderr
    script.write_text("import fairseq_pe\nfrom fairseq_pe.errors import UserError\nraise UserError('--x is wrong')\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "UserError: --x is wrong" in proc.stderr


def test_the_repl_goes_on_after_a_user_error():
    """issue 40, 3: the plugin's hook ended ``python -i`` at the first user error (os._exit(2))."""
    import subprocess

    commands = 'import fairseq_pe\nfrom fairseq_pe.errors import UserError\nraise UserError("x")\nprint("alive")\n'
    proc = subprocess.run([sys.executable, "-i"], input=commands, capture_output=True, text=True)
    assert "alive" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
    assert "UserError: x" in proc.stderr


def test_fairseq_train_ends_a_user_error_with_status_2_and_runs_atexit_handlers(data_bin, tmp_path):
    """A fresh ``fairseq-train --user-dir fairseq_pe`` (as its console script runs it) with a bad ``--pe-*`` value:
    one line, status 2, and the process's atexit handlers run (an os._exit skipped them)."""
    import shutil
    import subprocess

    marker = tmp_path / "atexit-ran"
    argv = [shutil.which("fairseq-train") or "fairseq-train", data_bin, "--user-dir", PLUGIN, *TRAIN,
            "--save-dir", str(tmp_path / "save"), "--pe-relative", "t5", "--pe-t5-num-buckets", "0"]
    code = (f"import atexit, sys\natexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
            f"sys.argv = {argv!r}\nfrom fairseq_cli.train import cli_main\nsys.exit(cli_main())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert_user_error(proc, "fairseq-train", "--pe-t5-num-buckets must be at least 4, got 0")
    assert marker.read_text() == "ran"


# ---- issue 31: bad values, tried ----------------------------------------------------------------------------------


@pytest.mark.parametrize("flags,message", [
    # inf passed `not factor >= 1`: linear lost the word order, yarn gave NaN
    (("--pe-relative", "rope", "--pe-rope-scaling", "linear", "--pe-rope-scaling-factor", "inf"),
     "needs --pe-rope-scaling-factor S, finite and at least 1"),
    (("--pe-relative", "rope", "--pe-rope-scaling", "yarn", "--pe-rope-scaling-factor", "nan",
      "--pe-rope-scaling-original-length", "64"), "needs --pe-rope-scaling-factor S, finite"),
    # inf or 1e300 left FIRE's bias no position information, then NaN gradients and a FloatingPointError
    (("--pe-relative", "fire", "--pe-fire-threshold", "inf"), "--pe-fire-threshold must be positive and at most 1e"),
    (("--pe-relative", "fire", "--pe-fire-threshold", "1e300"), "--pe-fire-threshold must be positive and at most"),
    # a head dimension of 2: rotary-embedding-torch divided by zero
    (("--pe-relative", "rope", "--encoder-attention-heads", "32", "--decoder-attention-heads", "32"),
     r"--pe-relative rope needs an even head dimension of at least 4 .* got 2 \(64 dimensions / 32 heads\)"),
    (("--pe-relative", "xpos", "--encoder-attention-heads", "32", "--decoder-attention-heads", "32"),
     "--pe-relative xpos needs an even head dimension of at least 4"),
    (("--pe-relative", "rope", "--cross-self-attention"),
     "--cross-self-attention is not supported with --pe-relative"),
])
def test_values_that_cannot_work_are_refused_by_name(flags, message):
    with pytest.raises(UserError, match=message):
        build_model("--pe-absolute", "none", *flags)


def test_rope_scaling_options_overridden_as_strings_or_dropped_on_a_checkpoint():
    """--model-overrides gives what the user typed: '4' is the number 4; a stored yarn overridden with 'none' is told
    what to override too (the factor and original length are in the checkpoint, not on the command line)."""
    model, _ = build_model("--pe-absolute", "none", "--pe-relative", "rope",
                           overrides={"pe_rope_scaling": "ntk", "pe_rope_scaling_factor": "4"})
    assert model.encoder.embed_positions.relative.factor == 4.0
    with pytest.raises(UserError, match="--pe-rope-scaling-factor: a number is needed, got 'four'"):
        build_model("--pe-absolute", "none", "--pe-relative", "rope",
                    overrides={"pe_rope_scaling": "ntk", "pe_rope_scaling_factor": "four"})
    stored = {"pe_rope_scaling": "none", "pe_rope_scaling_factor": 4.0, "pe_rope_scaling_original_length": 64}
    with pytest.raises(UserError, match=r"--pe-rope-scaling-factor and --pe-rope-scaling-original-length need "
                                        r"--pe-rope-scaling linear, ntk or yarn.*override them together, e\.g\. "
                                        r"--model-overrides .*'pe_rope_scaling_factor': None"):
        build_model("--pe-absolute", "none", "--pe-relative", "rope", overrides=stored)


def test_an_encoder_only_model_refuses_xpos():
    """roberta_pe with xPos was silently plain RoPE (identical logits)."""
    from types import SimpleNamespace

    from fairseq_pe.models.roberta_pe import RobertaPEModel

    from helpers import dictionary

    parser = __import__("argparse").ArgumentParser(argument_default=__import__("argparse").SUPPRESS)
    RobertaPEModel.add_args(parser)
    args = parser.parse_args(["--pe-absolute", "none", "--pe-relative", "xpos"])
    d = dictionary()
    d.add_symbol("<mask>")
    task = SimpleNamespace(source_dictionary=d, target_dictionary=d, max_positions=lambda: 64)
    with pytest.raises(UserError, match="--pe-relative xpos scales causal attention only .* use --pe-relative rope"):
        RobertaPEModel.build_model(args, task)


def test_fire_trains_without_reading_its_parameters_back():
    """FIRE took float(threshold_scale) in every layer: torch's "Converting a tensor with requires_grad=True to a
    scalar" warning, and a host sync."""
    import warnings

    model, d = build_model("--pe-absolute", "none", "--pe-relative", "fire")
    model.train()
    src, prev = random_tokens(d, 2, 9, left_pad=(0, 2)), random_tokens(d, 2, 7, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(src, torch.tensor([9, 7]), prev)[0].float().sum().backward()


def test_randomised_positions_name_their_flag_when_sentences_are_too_long(data_bin, tmp_path):
    """--pe-random-positions L limits a sequence to L tokens.  Training skips longer pairs (fairseq's convention): it
    says once how many and which flag set the limit (before: fairseq's one generic line, 2,675 of 3,000 pairs gone at
    L = 5).  Generation refuses a longer test sentence naming the flag (before: "a learned position table" and the
    task's limits, which do not help)."""
    save = tmp_path / "ckpt"
    proc = cli("fairseq-train", data_bin, "--user-dir", PLUGIN, *TRAIN, "--save-dir", str(save), "--pe-absolute",
               "sinusoidal", "--pe-random-positions", "5", "--skip-invalid-size-inputs-valid-test")
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "longer than the model's limit" in line]
    assert len(warnings) == 1, warnings  # once (validation is off)
    assert re.search(r"\d+ of 100 examples are longer than the model's limit, 5 tokens, and are skipped: the limit is "
                     r"--pe-random-positions 5 \(n tokens need n distinct positions in \[0, 5\)", warnings[0])
    proc = generate(data_bin, str(save / "checkpoint_last.pt"))
    assert_user_error(proc, "fairseq-generate", "Size of sample", "The model's limit, 5, is --pe-random-positions 5",
                      "train with a larger --pe-random-positions")
