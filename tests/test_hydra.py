"""fairseq's Hydra door (issue 56): ``fairseq-hydra-train`` with YAML configs runs the plugin's models, from the one
typed set of position options (:class:`fairseq_pe.models.position_config.PositionEncodingConfig`).

* The ``--pe-*`` flags of ``fairseq-train --help`` are generated from the dataclass by fairseq's own
  ``gen_parser_from_dataclass``: for every plugin architecture the flags, their choices and the defaults its
  architecture fills in equal the stored list made from the hand-written argparse options they replaced
  (``tests/fixtures/pe-flags.json``), and every field is a flag.
* fairseq's own example configs run with the plugin's models, only ``model._name``, the ``pe_*`` keys and the sizes
  changed: RoBERTa pretraining (``examples/roberta/config/pretraining/base.yaml``, as installed with fairseq), then
  fairseq's evaluation (``fairseq-validate``); GLUE fine-tuning (``finetuning/sst_2.yaml``) from a
  ``fairseq-train`` checkpoint on ../shared/data/glue; a ``transformer_lm_pe`` config on Austen's text, evaluated by
  ``fairseq-eval-lm``, and a ``fairseq-train`` checkpoint fine-tuned through it.
* A bad value through the YAML door is one line naming the key (``model.pe_relative``) and exit status 2: an unknown
  encoding, a wrong type, an option the chosen encoding does not take, a key no option has.

Mutations caught: a field of the dataclass dropped or renamed (the stored list); the flags written by hand again
beside the dataclass (``test_every_field_is_a_flag_and_every_flag_a_field``); ``config_door`` not converting a
Hydra config (the LM and RoBERTa runs: fairseq's ``TransformerConfig.from_namespace`` drops every ``pe_*`` key);
``hydra_user_errors`` left out (the bad values: Hydra's traceback and exit 1); ``as_config_keys`` left out (the
messages name ``--pe-relative``).
"""

import dataclasses
import json
import os

import pytest

from fairseq_pe.models.position_config import PositionEncodingConfig

from helpers import FIXTURES, PLUGIN, assert_user_error, cli

#: the task fairseq-train is given for each model's architectures
TASKS = {"roberta_pe": "masked_lm", "transformer_lm_pe": "language_modeling", "transformer_pe": "translation"}


def pe_flags(arch):
    """The ``--pe-*`` flags of ``fairseq-train --arch ARCH`` (option strings, choices, whether they take a value),
    by destination, and the values its architecture fills in when none is given."""
    from fairseq import options

    task = next(t for model, t in TASKS.items() if arch.startswith(model))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["/nonexistent", "--user-dir", PLUGIN, "--arch", arch, "--task", task])
    flags = {}
    for action in parser._actions:
        if any(o.startswith(("--pe-", "--no-pe-")) for o in action.option_strings):
            entry = flags.setdefault(action.dest, {"flags": [], "choices": None, "takes_value": False})
            entry["flags"] = sorted(set(entry["flags"]) | set(action.option_strings))
            if action.choices is not None:
                entry["choices"] = sorted(map(str, action.choices))
            entry["takes_value"] = entry["takes_value"] or action.nargs != 0
    return {"flags": flags, "defaults": {k: v for k, v in sorted(vars(args).items()) if k.startswith("pe_")}}


def test_the_flags_and_defaults_of_every_architecture_are_the_stored_ones():
    from fairseq.models import ARCH_MODEL_REGISTRY

    stored = json.loads(open(os.path.join(FIXTURES, "pe-flags.json")).read())
    archs = sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m.__module__.startswith("fairseq_pe"))
    assert archs == sorted(stored)
    for arch in archs:
        assert json.loads(json.dumps(pe_flags(arch))) == stored[arch], arch


def test_every_field_is_a_flag_and_every_flag_a_field():
    fields = {f.name for f in dataclasses.fields(PositionEncodingConfig)} - {"_name"}
    assert set(pe_flags("transformer_pe")["flags"]) == fields


# the runs


def write_yaml(path, text):
    path.write_text(text)
    return path


LM_YAML = """\
# @package _group_
common:
  user_dir: {plugin}
  cpu: true
  log_format: simple
  log_interval: 1
  seed: 1
checkpoint:
  save_dir: {save}
  no_epoch_checkpoints: true
task:
  _name: language_modeling
  data: {data}
  tokens_per_sample: 32
  sample_break_mode: none
criterion: cross_entropy
dataset:
  max_tokens: 512
  num_workers: 0
optimization:
  max_update: 3
  lr: [0.005]
optimizer:
  _name: adam
lr_scheduler:
  _name: fixed
model:
  _name: transformer_lm_pe_tiny
  pe_relative: alibi
  pe_absolute: none
"""


@pytest.fixture(scope="module")
def austen(tmp_path_factory):
    """Austen's *Persuasion*, chapter 1 (tests/fixtures, from ../shared/data/mono/en), by fairseq-pe-prepare-mono."""
    root = tmp_path_factory.mktemp("austen")
    text = root / "persuasion.txt"
    text.write_text(open(os.path.join(FIXTURES, "persuasion-chapter1.txt"), encoding="utf-8").read(), encoding="utf-8")
    cli("fairseq-pe-prepare-mono", "--input", text, "--destdir", root / "bin", "--vocab-size", "300",
        "--valid-percent", "30", "--workers", "1")
    return root / "bin"


def hydra_train(tmp_path, config_dir, config_name, *overrides, check=True):
    return cli("fairseq-hydra-train", "--config-dir", config_dir, "--config-name", config_name,
               f"hydra.run.dir={tmp_path / 'hydra'}", *overrides, cwd=tmp_path, check=check)


def test_a_language_model_trains_through_yaml_and_evaluates_with_fairseq_eval_lm(austen, tmp_path):
    config = write_yaml(tmp_path / "lm.yaml", LM_YAML.format(plugin=PLUGIN, save=tmp_path / "hydra-ck", data=austen))
    hydra_train(tmp_path, tmp_path, "lm")
    checkpoint = tmp_path / "hydra-ck" / "checkpoint_last.pt"
    proc = cli("fairseq-eval-lm", austen, "--path", checkpoint, "--user-dir", PLUGIN, "--gen-subset", "valid",
               "--cpu", "--num-workers", "0", "--max-tokens", "4096", "--tokens-per-sample", "64")
    assert "Perplexity" in proc.stderr + proc.stdout
    # the other way: a fairseq-train checkpoint fine-tuned through the YAML door
    cli("fairseq-train", austen, "--user-dir", PLUGIN, "--task", "language_modeling", "--arch", "transformer_lm_pe_tiny",
        "--tokens-per-sample", "32", "--sample-break-mode", "none", "--pe-relative", "alibi", "--pe-absolute", "none",
        "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "512", "--max-update", "2", "--cpu",
        "--num-workers", "0", "--save-dir", tmp_path / "argparse-ck", "--no-epoch-checkpoints")
    assert config.exists()
    proc = hydra_train(tmp_path, tmp_path, "lm", f"checkpoint.save_dir={tmp_path / 'tuned'}",
                       f"checkpoint.finetune_from_model={tmp_path / 'argparse-ck' / 'checkpoint_last.pt'}")
    assert "Loaded checkpoint" in proc.stdout + proc.stderr


def fairseq_example_configs():
    import fairseq

    return os.path.join(os.path.dirname(fairseq.__file__), "examples", "roberta", "config")


#: the sizes of fairseq's RoBERTa configs, shrunk for the CPU
SHRUNK = ["common.fp16=false", "common.cpu=true", "common.log_format=simple", "common.log_interval=1",
          "dataset.batch_size=8", "dataset.num_workers=0", "optimization.max_update=2", "optimization.update_freq=[1]",
          "lr_scheduler.warmup_updates=1", "+model.encoder_layers=2", "+model.encoder_embed_dim=32",
          "+model.encoder_ffn_embed_dim=64", "+model.encoder_attention_heads=2"]


def test_fairseqs_roberta_pretraining_config_runs_with_roberta_pe(austen, tmp_path):
    hydra_train(tmp_path, os.path.join(fairseq_example_configs(), "pretraining"), "base", f"task.data={austen}",
                f"common.user_dir={PLUGIN}", f"checkpoint.save_dir={tmp_path / 'ck'}", *SHRUNK,
                "task.tokens_per_sample=64", "model._name=roberta_pe_tiny", "model.max_positions=64",
                "+model.pe_relative=alibi", "+model.pe_absolute=none")
    proc = cli("fairseq-validate", austen, "--task", "masked_lm", "--path", tmp_path / "ck" / "checkpoint_last.pt",
               "--user-dir", PLUGIN, "--cpu", "--max-tokens", "512", "--tokens-per-sample", "64")
    assert "valid on 'valid' subset | loss" in proc.stdout + proc.stderr


@pytest.mark.shared_data
def test_fairseqs_glue_finetuning_config_runs_from_a_fairseq_train_checkpoint(glue_bin, tmp_path):
    work, _ = glue_bin
    data = work / "bin" / "SST-2-bin"
    pe = ["--pe-relative", "alibi", "--pe-absolute", "none"]
    cli("fairseq-train", data / "input0", "--user-dir", PLUGIN, "--arch", "roberta_pe_tiny", "--encoder-layers", "2",
        "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", *pe,
        "--task", "masked_lm", "--criterion", "masked_lm", "--tokens-per-sample", "256", "--cpu", "--num-workers", "0",
        "--optimizer", "adam", "--lr", "1e-4", "--max-update", "2", "--batch-size", "8", "--save-dir",
        tmp_path / "mlm", "--no-epoch-checkpoints")
    proc = hydra_train(tmp_path, os.path.join(fairseq_example_configs(), "finetuning"), "sst_2", f"task.data={data}",
                f"common.user_dir={PLUGIN}", f"checkpoint.save_dir={tmp_path / 'ft'}",
                f"checkpoint.restore_file={tmp_path / 'mlm' / 'checkpoint_last.pt'}", *SHRUNK,
                "task.max_positions=256", "dataset.max_tokens=4400", "model._name=roberta_pe_tiny",
                "+model.pe_relative=alibi", "+model.pe_absolute=none")
    assert "Loaded checkpoint" in proc.stdout + proc.stderr
    prefix = tmp_path / "eval" / "valid"
    cli("fairseq-pe-glue-eval", data, "--path", tmp_path / "ft" / "checkpoint_last.pt", "--user-dir", PLUGIN,
        "--split", "valid", "--out", prefix, "--cpu", "--batch-size", "16")
    result = json.loads(open(f"{prefix}.json").read())
    assert result["task"] == "SST-2" and 0.0 <= result["metrics"]["accuracy"] <= 1.0


@pytest.fixture(scope="module")
def glue_bin(tmp_path_factory):
    from test_glue import prepare_glue

    return prepare_glue(tmp_path_factory)


@pytest.mark.parametrize("override, message", [
    ("model.pe_relative=bogus", "model.pe_relative must be one of none, alibi"),
    ("model.pe_relative=5", "model.pe_relative must be one of none, alibi"),
    ("+model.pe_fox_gate_std=abc", "model.pe_fox_gate_std: a number is needed, got 'abc'"),
    ("+model.pe_t5_num_buckets=8", "model.pe_t5_num_buckets applies to model.pe_relative t5 only, not to "
                                   "model.pe_relative alibi; remove it"),
    ("+model.pe_relatve=alibi", "model.pe_relatve: no such position option (did you mean model.pe_relative"),
], ids=["unknown-encoding", "wrong-type", "not-a-number", "not-the-encodings-option", "no-such-key"])
def test_a_bad_value_through_yaml_is_one_line_naming_the_key(override, message, austen, tmp_path):
    write_yaml(tmp_path / "lm.yaml", LM_YAML.format(plugin=PLUGIN, save=tmp_path / "ck", data=austen))
    proc = hydra_train(tmp_path, tmp_path, "lm", override, check=False)
    assert_user_error(proc, "fairseq-hydra-train", message)
    assert not (tmp_path / "ck").exists() or not os.listdir(tmp_path / "ck")  # nothing trained, nothing written
