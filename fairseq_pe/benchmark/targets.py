"""The targets: per group of systems (matched by name patterns; the first group that matches counts), the largest
ratio to stock fairseq of each measurement, on the CPU.  A ratio is judged as printed, rounded to two decimals, so
that a table never contradicts itself: ``1.04× ✓``, ``1.31× ✗ (≤1.20)``; a summary line tells how many targets were
missed, and which were not measured.  The benchmark measures, it does not judge: its exit status does not depend on
the targets.

* the translation models (:data:`TARGETS`): the training time, the generation time and the encoder forward's memory
  at T = 2048;
* long context (:data:`LONG_TARGETS`): the evaluation memory at T = 16384 and 32768, the evaluation time at 16384,
  the memory per token at the longest T against T = 4096 (within ±10%), and on CUDA the training memory at 8192;
* language models (:data:`LM_TARGETS`): the training step as the translation training time's targets, the evaluation
  at 16L as the long-context ones.
"""

import fnmatch

from fairseq_pe import systems as catalogue

#: the length of the encoder-memory target
TARGET_LENGTH = 2048
TARGET_METRICS = {"train_s": "train time", f"encoder_{TARGET_LENGTH}": f"encoder mem at T={TARGET_LENGTH}",
                  "generate_s": "generation"}

#: the issue's targets: ratios to stock on CPU, at most (systems matched by name patterns)
TARGETS = [
    {"group": "none + every APE", "systems": ["none", "ape-*"],
     "train_s": 1.02, f"encoder_{TARGET_LENGTH}": 1.10, "generate_s": 1.02},
    {"group": "FLOATER input and all blocks", "systems": ["floater", "floater-input"],
     "train_s": 1.08, f"encoder_{TARGET_LENGTH}": 1.20, "generate_s": 1.02},
    # the encodings that compute the logits themselves (issue 43), before the biases that DAPE modifies: their
    # attention runs explicitly in blocks of rows, as the Shaw family's, hence that family's targets
    {"group": "FoX, CoPE, DAPE (v1, v2)", "systems": ["fox", "cope", "*-dape", "*-dape2"],
     "train_s": 1.20, f"encoder_{TARGET_LENGTH}": 2.0, "generate_s": 1.10},
    {"group": "RoPE, ALiBi, T5, KERPLE, Sandwich, FIRE, xPos, p-RoPE, Resonance RoPE, FoPE",
     "systems": ["rope", "rope-random", "alibi", "t5", "kerple-*", "sandwich", "fire", "xpos",
                 *catalogue.ROTARY_2024],
     "train_s": 1.08, f"encoder_{TARGET_LENGTH}": 1.5, "generate_s": 1.05},
    {"group": "Shaw, NEZHA, learnable-sin RPE", "systems": ["rpe-*"],
     "train_s": 1.20, f"encoder_{TARGET_LENGTH}": 2.0, "generate_s": 1.10},
    {"group": "FLOATER Q/K/V biases", "systems": ["floater-bias"],
     "train_s": 1.15, f"encoder_{TARGET_LENGTH}": 2.0, "generate_s": 1.02},
]


def target_group(name, groups=None):
    """The first group of ``groups`` (default :data:`TARGETS`) whose patterns match system ``name``, or None."""
    for group in TARGETS if groups is None else groups:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in group["systems"]):
            return group
    return None


#: the per-token base of the flatness target, and the lengths the memory and time targets are set at
PER_TOKEN_BASE = 4096
LONG_MEMORY_LENGTHS = (16384, 32768)
LONG_TIME_LENGTH = 16384
TRAIN_MEMORY_LENGTH = 8192

#: the issue's long-context targets, ratios to stock at the same T, at most (systems matched in order: the first
#: group whose patterns match); "per_token": the memory per token at the longest T against T = 4096, within ±10%
LONG_TARGETS = [
    {"group": "FLOATER Q/K/V biases", "systems": ["floater-bias"], "eval_mem": 2.5, "per_token": 0.10},
    {"group": "ALiBi, T5, KERPLE, Sandwich", "systems": ["alibi", "t5", "kerple-*", "sandwich"],
     "eval_mem": 1.10, "eval_s": 1.3, "per_token": 0.10, "train_mem": 1.2},
    # issue 57: FIRE's bias is no function of j − i (its normaliser takes max(i, j)), every block computes it
    {"group": "FIRE", "systems": ["fire"], "eval_mem": 1.10, "eval_s": 1.5, "per_token": 0.10, "train_mem": 1.2},
    # issue 57: the Shaw family's query terms (the keys outside a block's band on SDPA, the band written out)
    {"group": "the Shaw family (Shaw, NEZHA, learnable-sinusoidal RPE)", "systems": ["rpe-*", "*+rpe-*"],
     "eval_mem": 1.10, "eval_s": 2.0, "per_token": 0.10},
    {"group": "every other encoding", "systems": ["*"], "eval_mem": 1.10, "per_token": 0.10},
]


def long_target_group(name):
    return target_group(name, LONG_TARGETS)


#: the multiple of L whose evaluation the targets judge
LM_TARGET_MULTIPLE = 16

#: the language model's targets, ratios to stock at most (systems matched in order, the first group that matches):
#: the training step as the translation benchmark's training time (TARGETS), the evaluation at 16L as the encoder's
#: long-context evaluation (LONG_TARGETS: memory <= 1.10x, FLOATER's biases 2.5x; time <= 1.3x for the biases read
#: in place)
LM_TARGETS = [
    {"group": "none + every APE", "systems": ["none", "ape-*"], "train_s": 1.02, "eval_mem": 1.10},
    {"group": "FLOATER input and all blocks", "systems": ["floater", "floater-input"], "train_s": 1.08,
     "eval_mem": 1.10},
    {"group": "ALiBi, T5, KERPLE, Sandwich, FIRE", "systems": ["alibi", "t5", "kerple-*", "sandwich*", "fire*"],
     "train_s": 1.08, "eval_mem": 1.10, "eval_s": 1.3},
    {"group": "RoPE, xPos, p-RoPE, Resonance RoPE", "systems": ["rope", "rope-random", "xpos", "p-rope",
                                                               "rope-resonance"], "train_s": 1.08, "eval_mem": 1.10},
    {"group": "Shaw, NEZHA, learnable-sin RPE", "systems": ["rpe-*"], "train_s": 1.20, "eval_mem": 1.10},
    {"group": "FLOATER Q/K/V biases", "systems": ["floater-bias", "floater-warm"], "train_s": 1.15,
     "eval_mem": 2.5},
]

LM_TARGET_LABELS = {"train_s": "train step", "eval_mem": f"eval mem at {LM_TARGET_MULTIPLE}L",
                    "eval_s": f"eval time at {LM_TARGET_MULTIPLE}L"}


def lm_target_group(name):
    return target_group(name, LM_TARGETS)


def ratio_of(value, base):
    return value / base if base and base > 0 and value is not None else None


def cell(r, key, failed=None):
    """A table cell: the ratio of ``key`` with ✓ or ✗ (its target) where it has one; "failed" where the measurement
    failed (``failed``; default: the encoder measurement of that length failed), "n/a" where nothing was measured.
    The ± band of "per_token" is shown as its range."""
    if failed is None:
        failed = key.startswith("encoder_") and key[len("encoder_"):] in r.get("encoder_errors", {})
    if failed:
        return "failed"
    value = r["ratios"].get(key)
    if value is None:
        return "n/a"
    text = f"{value:.2f}×"
    target = r["targets"].get(key)
    if target is None or target["met"] is None:
        return text
    if target["met"]:
        return f"{text} ✓"
    bound = target["target"]
    return f"{text} ✗ ({1 - bound:.2f}–{1 + bound:.2f})" if key == "per_token" else f"{text} ✗ (≤{bound:.2f})"


def summary(results, unmeasured_label=None, missed_label=None, nothing="targets: none apply to these systems"):
    """The line that sums up the targets of ``results``, and its JSON: how many, met, missed (``missed_label(name,
    key, target)``), not measured (``unmeasured_label(name, key, result)``)."""
    unmeasured_label = unmeasured_label or (lambda name, key, r: f"{name} {TARGET_METRICS[key]}" + (
        " (failed)" if key.startswith("encoder_") and key[len("encoder_"):] in r.get("encoder_errors", {}) else ""))
    missed_label = missed_label or (
        lambda name, key, t: f"{name} {TARGET_METRICS[key]} {t['ratio']:.2f}× (≤{t['target']:.2f})")
    total, missed, unmeasured = 0, [], []
    for name, r in results.items():
        for key, t in r["targets"].items():
            total += 1
            if t["met"] is None:
                unmeasured.append(unmeasured_label(name, key, r))
            elif not t["met"]:
                missed.append(missed_label(name, key, t))
    line = (f"targets: {len(missed)} of {total} missed ({total - len(missed) - len(unmeasured)} met)"
            + (f": {'; '.join(missed)}" if missed else "") if total else nothing)
    if unmeasured:
        line += f" ({len(unmeasured)} not measured: {', '.join(unmeasured)})"
    return line, {"targets": total, "met": total - len(missed) - len(unmeasured), "missed": missed,
                  "not_measured": unmeasured}
