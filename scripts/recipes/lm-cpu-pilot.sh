#!/usr/bin/env bash
# The pilot that chooses the size of the CPU language models of issue 58 (lm-cpu-extrapolation.sh SCALE=context): no
# position encoding and ALiBi trained at two or three sizes with the same data, schedule and tokens, validated every
# VALIDATE_EVERY updates, so that their loss at L against the tokens seen shows at which size the encoding matters
# (the best encoding clearly below `none` at 1×L) within what 2 cores afford.
#
#   bash scripts/recipes/lm-cpu-pilot.sh [WORKDIR]
#
# 1. Data: as lm-cpu-extrapolation.sh (fairseq-pe-prepare-mono, whole documents held out, VOCAB pieces): WORKDIR/data.
# 2. Training: for each size of SIZES (default "tiny small medium": transformer_lm_pe_tiny, 2 layers of 64;
#    transformer_lm_pe_small, 4 layers of 128; the same with 192 dims and FFN 768) each system of SYSTEMS (default
#    "none alibi"), seed 1, at L tokens (64), MAX_UPDATE (2000) updates of MAX_TOKENS (2048) tokens, lr LR
#    (0.002) after WARMUP (200), validated every VALIDATE_EVERY (250) updates: WORKDIR/SIZE/runs/NAME-sSEED.  JOBS runs
#    at a time (2), THREADS threads each (1).  Interrupted runs resume (lm_cpu_common.sh).
# 3. fairseq-pe-lm-curves over every run's log, `none` the reference: WORKDIR/curves/curves.{md,json,png}.
# 4. fairseq-pe-lm-lengths on the test split at L and 4L, non-overlapping, every run's last checkpoint (named SIZE-SYSTEM):
#    the loss by token position, whether the models use their context: WORKDIR/positions.
# Time on the project's 2-core machine (two runs at a time, other work sharing it): docs/lm.md.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python}
WORK=${1:-lm-cpu-pilot-work}
DATA=${DATA:-$REPO/../shared/data/mono/en}
L=${L:-64}
VOCAB=${VOCAB:-4000}
SIZES=${SIZES:-tiny small medium}
SYSTEMS=${SYSTEMS:-none alibi}
SEEDS=1
MAX_UPDATE=${MAX_UPDATE:-2000}
MAX_TOKENS=${MAX_TOKENS:-2048}
LR=${LR:-0.002}
WARMUP=${WARMUP:-200}
VALIDATE_EVERY=${VALIDATE_EVERY:-250}
JOBS=${JOBS:-2}
THREADS=${THREADS:-1}
DRY_RUN=${DRY_RUN:-0}
PLUGIN=$REPO/fairseq_pe
export PYTHONUNBUFFERED=1

PROG=lm-cpu-pilot.sh TAG=lm-pilot
# shellcheck source=scripts/recipes/lm_cpu_common.sh
source "$REPO/scripts/recipes/lm_cpu_common.sh"
read_systems
for size in $SIZES; do [[ $size =~ ^(tiny|small|medium)$ ]] || die "SIZES: unknown size '$size' (tiny, small, medium)"; done
prepare_data

RUNS=() POINTS=()
TOP=$WORK
for size in $SIZES; do
  case $size in
    tiny) ARCH=transformer_lm_pe_tiny ARCH_ARGS="" ;;
    small) ARCH=transformer_lm_pe_small ARCH_ARGS="" ;;
    medium) ARCH=transformer_lm_pe_small ARCH_ARGS="--decoder-embed-dim 192 --decoder-ffn-embed-dim 768" ;;
    *) die "SIZES: unknown size '$size' (tiny, small, medium)" ;;
  esac
  # each size's runs under WORK/SIZE/runs, on the one data folder
  WORK=$TOP/$size
  [[ $DRY_RUN == 1 || -e $WORK/data ]] || { mkdir -p "$WORK"; ln -s ../data "$WORK/data"; }
  CHECKPOINTS=()
  train_systems "$size, L=$L, $MAX_UPDATE updates" --tokens-per-sample "$L" --sample-break-mode none --log-interval 100
  for name in $SYSTEMS; do
    RUNS+=("$size/$name=$WORK/runs/$name-s1/train.log")
    POINTS+=("$size-$name=$WORK/runs/$name-s1/checkpoint_last.pt")
  done
  WORK=$TOP
done

run "$WORK/logs/curves.log" fairseq-pe-lm-curves --run "${RUNS[@]}" --reference none --out "$WORK/curves" --force
[[ $DRY_RUN == 1 ]] || { cat "$WORK/curves/curves.md"; log "wrote $WORK/curves/curves.{md,json,png}"; }
# 4. whether the models use their context: the loss by token position on the test split at L and 4L, non-overlapping
OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS run "$WORK/logs/positions.log" fairseq-pe-lm-lengths \
  --data "$WORK/data" --gen-subset test --train-length "$L" --multipliers 1 4 --modes nonoverlapping \
  --checkpoint "${POINTS[@]}" --eval-lm-args=--cpu --jobs "$JOBS" --out "$WORK/positions" --force
[[ $DRY_RUN == 1 ]] || log "wrote $WORK/positions/lengths.{md,json,png} and positions.{json,png}"
