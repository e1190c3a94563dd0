#!/usr/bin/env bash
# The length-extrapolation experiment of ALiBi (Press et al., ICLR 2022, Figure 1) and KERPLE (Chi et al., NeurIPS
# 2022, Table 3) at CPU scale: language models trained at L tokens, their perplexity at L, 2L, ..., 32L.
#
#   bash scripts/recipes/lm-cpu-extrapolation.sh [WORKDIR]            # every encoding, seeds 1 2 3
#   QUICK=1 bash scripts/recipes/lm-cpu-extrapolation.sh [WORKDIR]    # the papers' 5 encodings, seed 1
#   SCALE=context bash scripts/recipes/lm-cpu-extrapolation.sh [WORKDIR]   # issue 58's scale: 9 encodings, 3 seeds
#
# SCALE=tiny (the default) is the first CPU run's settings, below.  SCALE=context is the scale where the models use
# their context, chosen by lm-cpu-pilot.sh (docs/lm.md): transformer_lm_pe_small (4 layers of 128, 4 heads, FFN 512),
# 2500 updates of 2048 tokens (5.1M tokens, about 1.1 epochs), WARMUP 200, validated and saved every 250 updates
# (an interrupted run resumes from its last save), the catalogue's group "lm-context" (none, sinusoidal, RoPE,
# ALiBi, T5, KERPLE-log, FIRE, FIRE under DAPE, FLOATER's Q/K/V biases), evaluated at 1-16 × L non-overlapping and
# in sliding windows scoring their last L tokens (STRIDE), and at L in windows scoring their last token (STRIDE_ONE=1:
# ALiBi's sliding evaluation, L times a non-overlapping pass).  Every variable below still overrides its defaults.
#
# 1. Data: fairseq-pe-prepare-mono on the English text of $DATA (default ../shared/data/mono/en: novels, State of
#    the Union addresses, WikiText-2's articles) with WHOLE documents held out (--split documents: a file, or a
#    WikiText article), VALID_PERCENT and TEST_PERCENT of the characters (default 1 and 1) for valid and test, and a
#    VOCAB-piece sentencepiece model (default 4000) learned on train: WORKDIR/data.
# 2. Training: one $ARCH (default transformer_lm_pe_tiny: 2 layers, 64 dims, 4 heads, FFN 256) per system of
#    $SYSTEMS and seed of $SEEDS, fairseq's language_modeling task at L tokens (--tokens-per-sample $L, default 64,
#    --sample-break-mode none), MAX_UPDATE updates (default 600) of MAX_TOKENS tokens (1024: 16 sequences), Adam
#    (0.9, 0.98), lr LR (0.002) after WARMUP (100) updates, inverse square root, dropout 0.1, weight decay 0.01, tied
#    input and output embeddings: WORKDIR/runs/NAME-sSEED (train.log, checkpoint_last.pt); JOBS runs at a time
#    (2), THREADS torch threads each (1).  600 x 1024 tokens is 13% of an epoch of the 4.7M training tokens: the
#    models are small and short-trained (valid perplexity about 250), enough to show which encodings hold past L
#    (MAX_UPDATE=1500 MAX_TOKENS=2048 WARMUP=200 reach about 140, at 5 times the time).
# 3. Evaluation: fairseq-pe-lm-lengths on the test split at L x $MULTIPLIERS (default 1 2 4 8 16 32; memory is no
#    limit at L = 64) in $MODES (default nonoverlapping, ALiBi's Figure 1 and KERPLE's Table 3; MODES="nonoverlapping
#    sliding" adds windows of N tokens scoring their last L, which costs N / L times a non-overlapping pass), JOBS
#    checkpoints at a time: WORKDIR/lengths/lengths.{md,json,png} and positions.{json,png} (the loss by token
#    position; mean ± sample std over the seeds and every seed's value; a learned table's refusal of a longer length
#    recorded as "refused").
#
# Systems: SYSTEMS (space-separated catalogue names; default the catalogue's group "encodings", one system per
# encoding, FLOATER in its three forms: `python -m fairseq_pe.systems names encodings`; with QUICK=1 the group
# "lm-wiki103" of the GPU recipe: sinusoidal, RoPE, T5's bias, ALiBi (ALiBi's Figure 1) and KERPLE-log).
# Time, measured on the 2-core CPU machine of this project (two runs at a time, one thread each): 103-162 s per
# training where nothing else ran, up to 8.5 min under other tests' load, FLOATER (an ODE solve per pass) 420-607 s;
# the evaluation's 324 fairseq-eval-lm runs 59 min with other work sharing the machine (28-42 s each).  On an idle
# machine the recipe's 18 systems before issue 43 (x 3 seeds = 54 runs) take about 1.5 h of training and under an hour
# of evaluation (the group has 24 since: the encodings of 2024-2025); QUICK=1 (5 runs, one seed) about 10-15 min in all.  The results of the full recipe, 3 seeds: docs/results.md.
# A re-run resumes: finished runs (their train.done) are skipped, an interrupted one continues from its last
# checkpoint_last.pt while its command is the same (SAVE_EVERY sets how often it is saved), the evaluation is
# skipped while the checkpoints it was run on (lengths/checkpoints.txt) are the same, and an interrupted evaluation
# reruns only the fairseq-eval-lm runs it had not finished (fairseq-pe-lm-lengths --resume: lengths/runs/); delete
# WORKDIR/runs/NAME-sSEED to redo one.
# Environment: SCALE, DATA, L, VOCAB, VALID_PERCENT, TEST_PERCENT, ARCH, ARCH_ARGS, SYSTEMS, SEEDS, QUICK, MAX_UPDATE,
# MAX_TOKENS, LR, WARMUP, VALIDATE_EVERY, SAVE_EVERY, JOBS, THREADS, MULTIPLIERS, MODES, STRIDE (sliding windows' scored
# tokens; default L), STRIDE_ONE, PYTHON (python: reads the catalogue), DRY_RUN=1 (print the commands).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python}
WORK=${1:-lm-cpu-extrapolation-work}
DATA=${DATA:-$REPO/../shared/data/mono/en}
SCALE=${SCALE:-tiny}
case $SCALE in
  tiny)  # the first CPU run (docs/results.md): tiny models, 600 updates of 1,024 tokens
    ARCH=${ARCH:-transformer_lm_pe_tiny} MAX_UPDATE=${MAX_UPDATE:-600} MAX_TOKENS=${MAX_TOKENS:-1024}
    WARMUP=${WARMUP:-100} MULTIPLIERS=${MULTIPLIERS:-1 2 4 8 16 32} MODES=${MODES:-nonoverlapping} ;;
  context)  # issue 58: the scale the pilot chose (lm-cpu-pilot.sh), where the models use their context
    ARCH=${ARCH:-transformer_lm_pe_small} MAX_UPDATE=${MAX_UPDATE:-2500} MAX_TOKENS=${MAX_TOKENS:-2048}
    WARMUP=${WARMUP:-200} MULTIPLIERS=${MULTIPLIERS:-1 2 4 8 16} MODES=${MODES:-nonoverlapping sliding}
    VALIDATE_EVERY=${VALIDATE_EVERY:-250} SAVE_EVERY=${SAVE_EVERY:-250} STRIDE_ONE=${STRIDE_ONE:-1} ;;
  *) echo "lm-cpu-extrapolation.sh: SCALE=$SCALE: use tiny (the default) or context" >&2; exit 2 ;;
esac
L=${L:-64}
VOCAB=${VOCAB:-4000}
QUICK=${QUICK:-0}
LR=${LR:-0.002}
JOBS=${JOBS:-2}
THREADS=${THREADS:-1}
STRIDE=${STRIDE:-}
STRIDE_ONE=${STRIDE_ONE:-0}
DRY_RUN=${DRY_RUN:-0}
PLUGIN=$REPO/fairseq_pe
export PYTHONUNBUFFERED=1

PROG=lm-cpu-extrapolation.sh TAG=lm-cpu
# shellcheck source=scripts/recipes/lm_cpu_common.sh
source "$REPO/scripts/recipes/lm_cpu_common.sh"

if [[ $QUICK == 1 ]]; then
  SYSTEMS=${SYSTEMS:-$(catalogue names lm-wiki103)} || die "$PYTHON cannot read fairseq_pe/systems.py"
  SEEDS=${SEEDS:-1}
elif [[ $SCALE == context ]]; then
  [[ $QUICK == 0 ]] || die "QUICK=$QUICK: use QUICK=1 (a few systems, one seed) or leave it out"
  SYSTEMS=${SYSTEMS:-$(catalogue names lm-context)} || die "$PYTHON cannot read fairseq_pe/systems.py"
  SEEDS=${SEEDS:-1 2 3}
else
  [[ $QUICK == 0 ]] || die "QUICK=$QUICK: use QUICK=1 (a few systems, one seed) or leave it out"
  SYSTEMS=${SYSTEMS:-$(catalogue names encodings)} || die "$PYTHON cannot read fairseq_pe/systems.py"
  SEEDS=${SEEDS:-1 2 3}
fi
read_systems
# FoPE zeroes the frequencies below 2π/L_train: the catalogue's length is the captions' (37), the models here train at L
for name in "${!FLAGS[@]}"; do
  FLAGS[$name]=$(sed -E "s/--pe-fope-train-length [0-9]+/--pe-fope-train-length $L/" <<< "${FLAGS[$name]}")
done

# ---- 1. data
prepare_data

# ---- 2. training, JOBS runs at a time
train_systems "L=$L, $MAX_UPDATE updates" --tokens-per-sample "$L" --sample-break-mode none --log-interval 100

# ---- 3. evaluation at L x MULTIPLIERS, non-overlapping and sliding (skipped while its checkpoints are the same)
ONCE_KEY=$(printf '%s\n' "L=$L" "multipliers=$MULTIPLIERS" "modes=$MODES" "stride=$STRIDE")
STRIDE_ARGS=()
[[ -z $STRIDE ]] || STRIDE_ARGS=(--stride "$STRIDE")
# shellcheck disable=SC2086
OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS once_per_checkpoints evaluated "$WORK/lengths" lengths.json \
  "$WORK/logs/lengths.log" fairseq-pe-lm-lengths --data "$WORK/data" --gen-subset test --train-length "$L" \
  --multipliers $MULTIPLIERS --modes $MODES ${STRIDE_ARGS[@]+"${STRIDE_ARGS[@]}"} --checkpoint "${CHECKPOINTS[@]}" \
  --eval-lm-args=--cpu --jobs "$JOBS" --out "$WORK/lengths" --force --resume
[[ $DRY_RUN == 1 ]] || { cat "$WORK/lengths/lengths.md"; log "wrote $WORK/lengths/lengths.{md,json,png} and positions.{json,png}"; }

# ---- 4. ALiBi's sliding evaluation at L (its Analysis and Table 7; --context-window L-1 in fairseq's terms: windows of
# L tokens, each scoring its last one), with STRIDE_ONE=1 (SCALE=context's default): WORK/lengths-stride1
if [[ $STRIDE_ONE == 1 ]]; then
  ONCE_KEY=$(printf '%s\n' "L=$L" "stride=1")
  OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS once_per_checkpoints "evaluated with stride 1" \
    "$WORK/lengths-stride1" lengths.json "$WORK/logs/lengths-stride1.log" fairseq-pe-lm-lengths --data "$WORK/data" \
    --gen-subset test --train-length "$L" --multipliers 1 --modes sliding --stride 1 --checkpoint "${CHECKPOINTS[@]}" \
    --eval-lm-args=--cpu --jobs "$JOBS" --out "$WORK/lengths-stride1" --force --resume
  [[ $DRY_RUN == 1 ]] || log "wrote $WORK/lengths-stride1/lengths.{md,json,png} and positions.{json,png}"
fi
