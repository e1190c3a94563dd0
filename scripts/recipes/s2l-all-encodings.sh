#!/usr/bin/env bash
# Every position encoding of this project on FLOATER's WMT14 En-De short-to-long (S2L) split
# (Liu et al. 2020, §4.3): trained on the pairs whose source is shorter than 80 sentencepiece
# tokens, tested on all pairs of 80 tokens or more, BLEU per source-length bin [80,100),
# [100,120), [120,140), [140,∞); Transformer-base. An extension of FLOATER's Figure 2, which
# compares only FLOATER, sinusoidal and learned positions (floater-figure2-s2l.sh).
#
# Usage:   bash scripts/recipes/s2l-all-encodings.sh
#          DRY_RUN=1 bash scripts/recipes/s2l-all-encodings.sh                 (print the commands only)
#          SYSTEMS="ape-sinusoidal rope alibi" bash scripts/recipes/s2l-all-encodings.sh
# Environment: see scripts/recipes/common.sh (DATA_ROOT, OUT_ROOT, MAX_UPDATE, UPDATE_FREQ,
# NUM_GPUS, PLUGIN, AVG_N, SYSTEMS, DRY_RUN, ...).
#
# Numbers to compare with: none published for this set of encodings. FLOATER's Figure 2 (a plot
# without numbers in the paper) covers three of them and states that FLOATER "performs
# particularly well on long sentences, even though only short sentences are seen by the model
# during training". The quickstart's synthetic analogue (docs/results.md, "The quickstart: three seeds") is the
# closest reference in this project: there the fixed sinusoids extrapolated best and the learned
# APE, the learned RPE and FLOATER from scratch the worst; this recipe tests that on real data.
#
# Systems (runs in OUT_ROOT/s2l-en-de/base/NAME, shared with floater-figure2-s2l.sh; the names
# and flags are the quickstart's):
#   none                    --pe-absolute none
#   ape-learned             --pe-absolute learned            (1024 positions, only 0-79 trained)
#   ape-sinusoidal          --pe-absolute sinusoidal
#   ape-learnable-sin       --pe-absolute learnable-sinusoidal
#   rpe-learned             --pe-absolute none --pe-relative learned               (Shaw, K = 64)
#   rpe-sinusoidal          --pe-absolute none --pe-relative sinusoidal            (NEZHA, K = 64)
#   rpe-learnable-sin       --pe-absolute none --pe-relative learnable-sinusoidal  (K = 64)
#   ape+rpe-learnable-sin   --pe-absolute learnable-sinusoidal --pe-relative learnable-sinusoidal
#                           (the APE+RPE pair Wang et al. found best on SQuAD)
#   rope                    --pe-absolute none --pe-relative rope
#   alibi                   --pe-absolute none --pe-relative alibi
#   t5                      --pe-absolute none --pe-relative t5
#   floater                 --pe-absolute floater --pe-all-blocks    (from scratch)
#   floater-bias            --pe-absolute sinusoidal --pe-floater-bias   (from scratch)
#   floater-ws              FLOATER's warm start: ape-sinusoidal converted by
#                           fairseq-pe-warm-start-floater, fine-tuned FINETUNE_UPDATES updates
#   ape-sinusoidal-cont     control for floater-ws: ape-sinusoidal fine-tuned the same way
# Averaging of the last 5 checkpoints, beam 4, length penalty 0.6, max length source + 50; one
# table and one PNG of BLEU per bin (OUT_ROOT/s2l-en-de/base/results/s2l-all.{txt,json,png}),
# sacreBLEU and tokenised compound-split BLEU.
#
# Expected GPU time (ESTIMATES, not measured): 13 base runs from scratch (each ≈ 3-5 h on 8×V100
# with fp16, ≈ 8-12 h on one H100; the four Shaw/NEZHA-style RPE runs budgeted at ≈ 1.1×, floater
# and floater-bias at 1.5-2×: their ODE is solved sequentially over positions, see
# floater-table2.sh) + 2 fine-tunings of 20k updates: ≈ 45-80 h on 8×V100 (≈ 360-640 GPU-hours),
# ≈ 120-190 h on one H100; ≈ 3 runs less when floater-figure2-s2l.sh has run (shared runs are not
# trained again).
set -euo pipefail
# shellcheck source=scripts/recipes/common.sh
case $0 in */*) source "${0%/*}/common.sh" ;; *) source ./common.sh ;; esac

setup_model base en-de
preflight fairseq-pe-prepare-wmt14 fairseq-pe-average-checkpoints fairseq-pe-s2l-split fairseq-train fairseq-generate \
    fairseq-pe-warm-start-floater fairseq-pe-bucket-bleu fairseq-pe-bucket-loss
RUN_DIR=$OUT_ROOT/s2l-en-de/base

prepare_s2l
DATA=$S2L_DIR/data-bin

declare -A FLAGS=()
catalogue_group s2l-all-encodings  # FROM_SCRATCH and FLAGS from fairseq_pe/systems.py
NEED_SIN=0
if selected floater-ws || selected ape-sinusoidal-cont; then NEED_SIN=1; fi

train_and_evaluate_all "$DATA"

RESULTS=$RUN_DIR/results/s2l-all
score "$RESULTS" "WMT14 En-De S2L (train < 80 tokens): every encoding, base" \
    80,100,120,140+ "$S2L_DIR/test.en" "$S2L_DIR/test.de" "$S2L_DIR/spm.model"
score_loss "$RESULTS-loss" "teacher-forced loss of the S2L references" 80,100,120,140+ "$DATA"
if ! dry; then
    cat "$RESULTS.txt" "$RESULTS-loss.txt"
    log "plots: $RESULTS.png, $RESULTS-loss.png; split statistics: $S2L_DIR/stats.json"
fi
