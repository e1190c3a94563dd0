#!/usr/bin/env bash
# FLOATER (Liu et al., ICML 2020), Table 2: WMT14 En-De / En-Fr BLEU of FLOATER, the pre-defined
# sinusoidal encoder and the fixed-length (learned) position embedding, each at the input block
# only and at all blocks, Transformer-base or -big (the paper's "Transformer-Large").
#
# Usage:   bash scripts/recipes/floater-table2.sh [en-de|en-fr] [base|big]     (default: en-de base)
#          DRY_RUN=1 bash scripts/recipes/floater-table2.sh en-fr big          (print the commands only)
#          SYSTEMS="ape-sinusoidal floater-ws" bash scripts/recipes/floater-table2.sh   (a subset)
# Environment: see scripts/recipes/common.sh (DATA_ROOT, OUT_ROOT, MAX_UPDATE, FINETUNE_UPDATES,
# UPDATE_FREQ, NUM_GPUS, PLUGIN, AVG_N, SYSTEMS, DRY_RUN, ...).
#
# The paper's Table 2 (BLEU on newstest2014; the paper does not say which BLEU: compare with the
# tokenised, compound-split table, the convention of its baselines, Vaswani et al. 2017):
#
#                                              Transformer-Base     Transformer-Large
#                                              En-De    En-Fr       En-De    En-Fr
#   Position encoders at all blocks
#     FLOATER                                  28.6     41.6        29.2     42.7
#     Pre-defined Sinusoidal Position Encoder  28.2     40.6        28.4     42.0
#     Fixed-length Position Embedding          26.9     40.9        28.3     42.0
#   Position encoder only at input block
#     FLOATER                                  28.3     41.1        29.1     42.4
#     Pre-defined Sinusoidal Position Encoder  27.9     40.4        28.4     41.8
#     Fixed-length Position Embedding          27.8     40.9        28.5     42.4
#
# Systems trained here (runs in OUT_ROOT/wmt14-PAIR/SIZE/NAME):
#   ape-sinusoidal      sinusoidal at the input block            (row: sinusoidal, input only)
#   ape-sinusoidal-all  sinusoidal at every block, P(i)+P(n)     (row: sinusoidal, all blocks)
#   ape-learned         learned table at the input               (row: fixed-length embedding, input only)
#   ape-learned-all     one learned table per block              (row: fixed-length embedding, all blocks)
#   floater-input       FLOATER ODE at the input, from scratch   (row: FLOATER, input only)
#   floater             FLOATER ODE at every block (θ shared, one initial value per block), from scratch
#   floater-ws          the paper's warm-start schedule (§3.3, §4.4): ape-sinusoidal's last checkpoint
#                       converted by fairseq-pe-warm-start-floater into FLOATER's Q/K/V-bias form
#                       (biases in every block: FLOATER at all blocks, Eq. 12-13; exact at conversion),
#                       then fine-tuned FINETUNE_UPDATES updates    (row: FLOATER, all blocks)
#   ape-sinusoidal-cont control for floater-ws: ape-sinusoidal fine-tuned with the same schedule
#                       without FLOATER, so that the gain of floater-ws is not just more updates
# This project has no warm start for FLOATER at the input block only: its bias form acts in every
# block, so the input-only FLOATER row is the from-scratch floater-input.
# Every model: Vaswani et al.'s hyper-parameters (common.sh), the last AVG_N checkpoints averaged
# (5 base / 10 big), beam 4, length penalty 0.6; scored by fairseq-pe-bucket-bleu on the full
# newstest2014 (3,003 sentences), sacreBLEU and tokenised compound-split BLEU, with length buckets.
#
# Expected GPU time (ESTIMATES, not measured: no GPU run of this recipe has been made; the paper
# does not report its hardware or training time). One base run = 100k updates of ≈32k tokens
# (Vaswani et al.: 12 h on 8 P100): ≈ 3-5 h on 8×V100 with fp16 (25-40 GPU-hours), ≈ 8-12 h on one
# H100, ≈ 12-20 h on one A100. One big run = 300k updates (Vaswani et al.: 3.5 days on 8 P100):
# ≈ 20-25 h on 8×V100 (≈ 180 GPU-hours), ≈ 50-70 h on one H100. FLOATER's ODE is solved
# sequentially over the positions of each micro-batch (one rk4 step per position, in float32):
# 1.04× a sinusoidal run on CPU (docs/speed.md), but on GPUs small sequential kernels are launch-bound,
# so we budget 1.5-2× per update for floater, floater-input and the floater-ws fine-tuning (not
# measured). Whole recipe (6 runs from scratch, 2 of them FLOATER, + 2 fine-tunings of 20k updates):
#   base: ≈ 22-45 h on 8×V100 (≈ 180-350 GPU-hours); ≈ 60-105 h on one H100
#   big:  ≈ 140-200 h on 8×V100 (≈ 1,100-1,600 GPU-hours); ≈ 350-560 h on one H100
# En-Fr costs the same per update (the updates are fixed, not the epochs: 100k updates are ≈ 2
# epochs of its 40.8M pairs) but its data preparation takes hours and ≈ 15 GB of disk. Disk: each
# run keeps KEEP_INTERVAL_UPDATES=10 checkpoints with optimizer state: ≈ 7 GB (base), ≈ 25 GB (big).
set -euo pipefail
# shellcheck source=scripts/recipes/common.sh
case $0 in */*) source "${0%/*}/common.sh" ;; *) source ./common.sh ;; esac

PAIR=${1:-en-de}
SIZE=${2:-base}
case $PAIR in en-de | en-fr) ;; *) die "language pair '$PAIR': use en-de or en-fr" ;; esac
setup_model "$SIZE" "$PAIR"
preflight fairseq-pe-prepare-wmt14 fairseq-pe-average-checkpoints fairseq-train fairseq-generate fairseq-pe-warm-start-floater fairseq-pe-bucket-bleu
RUN_DIR=$OUT_ROOT/wmt14-$PAIR/$SIZE

prepare_wmt14 "$PAIR"
DATA=$WMT_DIR/data-bin

declare -A FLAGS=()
catalogue_group floater-table2  # FROM_SCRATCH and FLAGS from fairseq_pe/systems.py

# the warm start needs the sinusoidal model
if selected floater-ws || selected ape-sinusoidal-cont; then
    selected ape-sinusoidal || log "floater-ws/ape-sinusoidal-cont need ape-sinusoidal: training it too"
    NEED_SIN=1
else
    NEED_SIN=0
fi

train_and_evaluate_all "$DATA"

RESULTS=$RUN_DIR/results/table2
score "$RESULTS" "FLOATER Table 2: WMT14 $PAIR newstest2014, $SIZE" 0,20,40,60,80+ \
    "$WMT_DIR/raw/test.$SRC" "$WMT_DIR/raw/test.$TGT" "$WMT_DIR/spm/spm.model"

# the paper's column for this pair and size, next to the systems it corresponds to
col=0
[[ $SIZE == big ]] && col=$((col + 2))
[[ $PAIR == en-fr ]] && col=$((col + 1))
paper=("28.6 41.6 29.2 42.7" "28.2 40.6 28.4 42.0" "26.9 40.9 28.3 42.0"
       "28.3 41.1 29.1 42.4" "27.9 40.4 28.4 41.8" "27.8 40.9 28.5 42.4")
# each row of the paper's table: its label | the system(s) here
rows=("all blocks: FLOATER|floater-ws (warm start), floater (scratch)" "all blocks: sinusoidal|ape-sinusoidal-all"
      "all blocks: fixed-length embedding|ape-learned-all" "input only: FLOATER|floater-input"
      "input only: sinusoidal|ape-sinusoidal" "input only: fixed-length embedding|ape-learned")
report="# FLOATER Table 2, Transformer-$SIZE $PAIR: the paper's BLEU <-> the system(s) here"
for i in "${!paper[@]}"; do
    read -r -a v <<< "${paper[$i]}"
    report+=$'\n'"$(printf '#   %-36s %5s  <->  %s' "${rows[$i]%%|*}" "${v[$col]}" "${rows[$i]#*|}")"
done
report+=$'\n'"# control for the warm start (same extra updates, no FLOATER): ape-sinusoidal-cont"
report+=$'\n'"# results: $RESULTS.txt ('all' column; tokenised compound-split BLEU is the paper-comparable one), $RESULTS.png"
printf '%s\n' "$report"
if ! dry; then
    printf '%s\n' "$report" > "$RESULTS.paper.txt"
    cat "$RESULTS.txt"
fi
