"""End to end through the real CLIs: fairseq-preprocess -> fairseq-train -> fairseq-generate.

For every absolute encoding (with and without --pe-all-blocks), every relative encoding, the
six APE+RPE pairs of Wang et al. Table 2, FLOATER (input block, all blocks, the Q/K/V-bias
form) and each recurrent baseline of FLOATER's Table 6:
* every test sentence gets exactly one hypothesis (27 sentences, fairseq's default
  --required-batch-size-multiple 8, batches of 5: the stock last-batch drop would lose some);
* the checkpoint stores the --pe-* options, and fairseq-validate on the reloaded
  checkpoint (given no --pe-* flag) reproduces the final validation loss of training;
* incremental decoding: the per-token scores beam search prints equal those of
  ``fairseq-generate --score-reference`` on the same hypotheses.
"""

import os
import re
import shutil

import pytest
import torch

from fairseq import checkpoint_utils

from fairseq_pe.translation.bleu import read_generate_output
from fairseq_pe.translation.synthetic import write_corpus

from helpers import PLUGIN, cli

ABSOLUTE = ["none", "learned", "sinusoidal", "learnable-sinusoidal"]
RELATIVE = ["learned", "sinusoidal", "learnable-sinusoidal", "rope", "alibi", "t5", "kerple-log", "kerple-power", "xpos", "sandwich", "fire",
            "p-rope"]
# (absolute, --pe-all-blocks, relative, other flags)
CONFIGS = (
    [(a, False, "none", ()) for a in ABSOLUTE + ["floater"]]
    + [(a, True, "none", ()) for a in ABSOLUTE[1:] + ["floater"]]
    + [("none", False, r, ()) for r in RELATIVE]
    # the six APE+RPE pairs of Wang et al. Table 2
    + [(a, False, r, ()) for a in ("learned", "learnable-sinusoidal") for r in RELATIVE[:3]]
    # FLOATER's Q/K/V-bias form on a sinusoidal model, and the recurrent baselines of its Table 6
    + [("sinusoidal", False, "none", ("--pe-floater-bias",)),
       ("sinusoidal", False, "none", ("--pe-floater-bias", "--pe-floater-dynamics", "rnn")),
       ("floater", True, "none", ("--pe-floater-dynamics", "gru", "--pe-floater-rnn-input", "vector")),
       ("floater", False, "none", ("--pe-floater-dynamics", "lstm", "--pe-floater-rnn-layers", "2"))]
    # Resonance RoPE trained (Wang et al. 2024: RoPE's wavelengths rounded), FoPE (Hua et al. 2024)
    + [("none", False, "rope", ("--pe-rope-resonance",)), ("none", False, "fope", ("--pe-fope-train-length", "37"))]
    # the encodings that compute the logits themselves (issue 43): FoX, CoPE, and DAPE on a bias, v1 on KERPLE (its
    # paper's main system), v2 on ALiBi
    + [("none", False, r, ()) for r in ("fox", "cope")]
    + [("none", False, "kerple-log", ("--pe-dape", "v1")), ("none", False, "alibi", ("--pe-dape", "v2"))]
    # randomised positions (Ruoss et al.): an APE, a rotary and a bias encoding
    + [(a, False, r, ("--pe-random-positions", "64")) for a, r in (("sinusoidal", "none"), ("none", "rope"),
                                                                    ("none", "alibi"))]
)


def config_id(config):
    a, all_blocks, r, extra = config
    return (f"ape-{a}{'-all' if all_blocks else ''}" + (f"+rpe-{r}" if r != "none" else "")
            + "".join("+" + f.replace("--pe-floater-", "").replace("--pe-", "") if f.startswith("--") else "-" + f
                      for f in extra))
N_TEST = 27
# 15 updates (within the first epoch: training ends with one validation): no assertion depends on how well the
# model translates, but it must have learnt to end a sentence, or beam search runs every hypothesis to fairseq's
# 200-token limit (12 updates with a 20-update warm-up: 201 tokens, 6x the decoding time); with 15, every
# hypothesis of the configurations tried ends right after --min-len
TRAIN_FLAGS = ["--arch", "transformer_pe_tiny", "--optimizer", "adam", "--lr", "0.005",
               "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10", "--max-tokens", "1000",
               "--max-update", "15", "--no-epoch-checkpoints", "--seed", "1", "--cpu",
               "--num-workers", "0", "--log-format", "simple", "--share-all-embeddings",
               "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    raw = write_corpus(str(root / "raw"), train_size=1500, valid_size=60,
                       test_buckets=[(1, 8), (9, 16), (17, 30)], test_per_bucket=N_TEST // 3, seed=3)
    dest = str(root / "bin")
    cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test",
        "--destdir", dest, "--joined-dictionary", "--workers", "1")
    return dest


def last_valid_loss(log: str) -> str:
    losses = re.findall(r"valid on 'valid' subset \| loss ([\d.]+)", log)
    assert losses, log[-2000:]
    return losses[-1]


def positional_scores(generate_stdout: str):
    scores = {}
    for line in generate_stdout.splitlines():
        if line.startswith("P-"):
            idx, vals = line[2:].split("\t", 1)
            assert int(idx) not in scores, f"two P- lines for sentence {idx}"
            scores[int(idx)] = [float(v) for v in vals.split()]
    return scores


@pytest.mark.parametrize("name,all_blocks,relative,extra", CONFIGS, ids=[config_id(c) for c in CONFIGS])
def test_train_generate_rescore(tmp_path, data_bin, name, all_blocks, relative, extra):
    save = str(tmp_path / "ckpt")
    pe = ["--pe-absolute", name, "--pe-relative", relative] + (["--pe-all-blocks"] if all_blocks else []) + list(extra)
    train = cli("fairseq-train", data_bin, "--user-dir", PLUGIN, *TRAIN_FLAGS, *pe, "--save-dir", save)
    ckpt = os.path.join(save, "checkpoint_last.pt")

    # the options are in the checkpoint ...
    state = checkpoint_utils.load_checkpoint_to_cpu(ckpt)
    assert state["cfg"]["model"].pe_absolute == name
    assert state["cfg"]["model"].pe_all_blocks == all_blocks
    assert state["cfg"]["model"].pe_relative == relative
    assert state["cfg"]["model"].pe_floater_bias == ("--pe-floater-bias" in extra)
    if "--pe-floater-dynamics" in extra:
        assert state["cfg"]["model"].pe_floater_dynamics == extra[extra.index("--pe-floater-dynamics") + 1]
    # ... and the reloaded model, built without any --pe-* flag, scores the validation set identically
    val = cli("fairseq-validate", data_bin, "--user-dir", PLUGIN, "--task", "translation", "--path", ckpt, "--cpu",
              "--max-tokens", "700", "--num-workers", "0")
    assert re.search(r"valid on 'valid' subset \| loss ([\d.]+)", val.stdout + val.stderr).group(1) \
        == last_valid_loss(train.stdout + train.stderr)

    # every sentence exactly once, with fairseq's default --required-batch-size-multiple
    gen = cli("fairseq-generate", data_bin, "--user-dir", PLUGIN, "--path", ckpt, "--gen-subset", "test",
              "--beam", "4", "--batch-size", "5", "--cpu", "--num-workers", "0",
              # a barely trained model stops at once: force several incremental steps
              # (only EOS is masked, the other tokens' scores are the model's own)
              "--min-len", "6",
              # and at most 40 tokens (the test's targets have at most 30): a model that has not learnt to end in 15
              # updates (DAPE's network, not 0 at initialisation) would decode to fairseq's 200 at every beam
              "--max-len-a", "0", "--max-len-b", "40")
    gen_file = tmp_path / "generate.txt"
    gen_file.write_text(gen.stdout)
    sentences = read_generate_output(str(gen_file), expected=N_TEST, detokenized=False)
    beam_scores = positional_scores(gen.stdout)
    assert sorted(beam_scores) == list(range(N_TEST))

    # rescoring those hypotheses as references gives the scores beam search printed (fairseq reads
    # them as text, --dataset-impl raw, with the same dictionaries and EOS as fairseq-preprocess)
    rescore = tmp_path / "rescore"
    rescore.mkdir()
    (rescore / "test.src-tgt.src").write_text("".join(s.source + "\n" for s in sentences))
    (rescore / "test.src-tgt.tgt").write_text("".join(s.hypothesis + "\n" for s in sentences))
    for side in ("src", "tgt"):
        shutil.copy(f"{data_bin}/dict.{side}.txt", rescore)
    ref = cli("fairseq-generate", str(rescore), "--user-dir", PLUGIN, "--path", ckpt, "--gen-subset", "test",
              "--dataset-impl", "raw", "--score-reference", "--batch-size", "7", "--cpu", "--num-workers", "0")
    ref_scores = positional_scores(ref.stdout)
    assert sorted(ref_scores) == list(range(N_TEST))
    lengths = set()
    for i in range(N_TEST):
        assert len(ref_scores[i]) == len(beam_scores[i]), i
        torch.testing.assert_close(torch.tensor(ref_scores[i]), torch.tensor(beam_scores[i]), rtol=0, atol=1.5e-4)  # printed to 4 decimals
        lengths.add(len(beam_scores[i]))
    assert min(lengths) >= 7, "hypotheses too short to exercise incremental decoding"
