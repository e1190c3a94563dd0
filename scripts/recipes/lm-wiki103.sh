#!/usr/bin/env bash
# The length-extrapolation benchmark of ALiBi (Press et al., ICLR 2022, §4, Figure 1 and Table 1) and KERPLE
# (Chi et al., NeurIPS 2022, Table 3): word-level WikiText-103 language models trained at L = 512 and 1024 tokens,
# evaluated at L, 2L, ..., 16L, in non-overlapping and sliding windows (docs/lm.md).
#
# Settings, as ALiBi's README (github.com/ofirpress/attention_with_linear_biases) trains them, which are fairseq's
# examples/language_model settings of Baevski & Auli (2019) at L = 512:
#   model     transformer_lm_pe_wiki103 = fairseq's transformer_lm_wiki103 (16 layers of 1024, 8 heads, FFN 4096,
#             adaptive input and softmax, cut-offs 20k/60k; 247M parameters) with the encoding's --pe-* flags
#   training  --max-update 286000, NAG, --lr 1.0, cosine schedule (--t-mult 2 --lr-period-updates 270000
#             --lr-shrink 0.75 --min-lr 1e-4), 16,000 warm-up updates from 1e-7, --clip-norm 0.1, adaptive_loss,
#             --max-tokens 9216 per GPU on 8 GPUs (73,728 tokens an update; fewer GPUs: --update-freq makes it up),
#             --sample-break-mode none, --fp16, seed 1
#   data      WikiText-103 from the raw release (fairseq-pe-prepare-wikitext: word-level, words seen fewer than 3
#             times in train -> <unk>, WikiText's own vocabulary; ALiBi binarised the release with <unk> already in)
#   eval      fairseq-pe-lm-lengths --gen-subset test at L x 1 2 4 8 16 (MULTIPLIERS), nonoverlapping and sliding
#             with a stride of L (OUT_ROOT/L$L/lengths), then ALiBi's own sliding evaluation at L, windows of L
#             tokens scoring one each (--stride 1, fairseq's --context-window L-1; L times a non-overlapping pass;
#             OUT_ROOT/L$L/lengths-stride1; STRIDE_ONE=0 leaves it out): the measurements of the CPU run
#             (docs/results.md), the loss by token position included
#
# Systems (runs in OUT_ROOT/L$L/NAME): the catalogue's group lm-wiki103 (fairseq_pe/systems.py): the encodings of
# ALiBi's Figure 1 (sinusoidal, rotary, T5's bias, ALiBi) and KERPLE's logarithmic kernel; SYSTEMS="..." runs any
# catalogue systems instead (`python -m fairseq_pe.systems names encodings`).
#
# Usage:   bash scripts/recipes/lm-wiki103.sh                  (prepare, train every system at L = 512 and 1024,
#                                                               evaluate; each step skipped when done: rerun resumes)
#          DRY_RUN=1 bash scripts/recipes/lm-wiki103.sh        (print the commands only)
#          LENGTHS=512 SYSTEMS="alibi rope" bash scripts/recipes/lm-wiki103.sh
# Environment: DATA (the binarised data, default ./lm-data/wikitext-103), RAW_DIR (wiki.{train,valid,test}.raw or
#   wikitext-103-raw-v1.zip; default: downloaded), OUT_ROOT (./lm-wiki103-runs), LENGTHS ("512 1024"),
#   SYSTEMS, MULTIPLIERS ("1 2 4 8 16"), STRIDE (L), STRIDE_ONE (1), MAX_UPDATE (286000), MAX_TOKENS (9216 per GPU),
#   NUM_GPUS (visible GPUs), SEED (1), PRECISION (fp16; bf16 or fp32), TRAIN_EXTRA (more fairseq-train flags),
#   EVAL_MAX_TOKENS (fairseq-eval-lm --max-tokens, raised to each N: 16384), DRY_RUN=1, ALLOW_CPU=1, PYTHON.
#
# Expected GPU time (an ESTIMATE, not measured here): one model is 286,000 updates of 73,728 tokens = 21.1 B tokens,
# 6 x 247M x 21.1e9 = 3.1e19 FLOPs plus attention: ≈ 36-45 h on 8×V100 with fp16 (≈ 290-360 GPU-hours) at
# L = 512, ≈ 10% more at 1024 (Baevski & Auli report 67 h on 8 V100 for their L = 3072 model); ≈ 45-90 h on
# one H100 with bf16.  The default 5 systems × 2 lengths: ≈ 3,000-4,000 V100 GPU-hours, ≈ 450-900 H100-hours.
# The evaluation: 5 lengths × 2 modes per model, each one pass over the 245k test tokens (sliding at stride L
# reads N/L times more): < 1 GPU-hour per model; the stride-1 pass at L reads L × 245k tokens (126M at L = 512),
# about as many as 1,700 training updates: ≈ 1-2 GPU-hours per model more.  Data preparation (CPU): ≈ 10-20 min.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python}
DATA=${DATA:-$PWD/lm-data/wikitext-103}
OUT_ROOT=${OUT_ROOT:-$PWD/lm-wiki103-runs}
LENGTHS=${LENGTHS:-512 1024}
MULTIPLIERS=${MULTIPLIERS:-1 2 4 8 16}
MAX_UPDATE=${MAX_UPDATE:-286000}
MAX_TOKENS=${MAX_TOKENS:-9216}
EVAL_MAX_TOKENS=${EVAL_MAX_TOKENS:-16384}
SEED=${SEED:-1}
STRIDE_ONE=${STRIDE_ONE:-1}
PRECISION=${PRECISION:-fp16}
DRY_RUN=${DRY_RUN:-0}
PLUGIN=$REPO/fairseq_pe
if [[ -z ${NUM_GPUS:-} ]]; then
  if [[ $DRY_RUN == 1 ]]; then NUM_GPUS=8; else NUM_GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())'); fi
fi
DEVICE=()
if [[ $NUM_GPUS == 0 ]]; then
  [[ ${ALLOW_CPU:-0} == 1 ]] || { echo "lm-wiki103.sh: no GPU found (set ALLOW_CPU=1 to run on the CPU anyway)" >&2; exit 2; }
  NUM_GPUS=1; DEVICE=(--cpu)
else
  case $PRECISION in
    fp16) DEVICE=(--fp16) ;; bf16) DEVICE=(--bf16) ;; fp32) DEVICE=() ;;
    *) echo "lm-wiki103.sh: PRECISION must be fp16, bf16 or fp32, not '$PRECISION'" >&2; exit 2 ;;
  esac
fi
# ALiBi's 8 GPUs × MAX_TOKENS per update, whatever the GPUs here
UPDATE_FREQ=${UPDATE_FREQ:-$(( (8 * 9216 + MAX_TOKENS * NUM_GPUS - 1) / (MAX_TOKENS * NUM_GPUS) ))}

# the systems: the catalogue's group lm-wiki103 (`python -m fairseq_pe.systems group lm-wiki103`)
case ${BASH_SOURCE[0]} in */*) CATALOGUE_REPO=${BASH_SOURCE[0]%/*}/../.. ;; *) CATALOGUE_REPO=../.. ;; esac
catalogue() { PYTHONPATH="$CATALOGUE_REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m fairseq_pe.systems "$@"; }
CATALOGUE=$(catalogue group lm-wiki103) || { echo "lm-wiki103.sh: $PYTHON cannot read fairseq_pe/systems.py" >&2; exit 2; }
ORDER=$(cut -d' ' -f1 <<< "$CATALOGUE" | tr '\n' ' ')
SYSTEMS=${SYSTEMS:-$ORDER}
declare -A FLAGS=()
for s in $SYSTEMS; do
  FLAGS[$s]=$(catalogue flags "$s") || { echo "lm-wiki103.sh: SYSTEMS: unknown system '$s' (python -m fairseq_pe.systems names encodings)" >&2; exit 2; }
done
for L in $LENGTHS; do
  [[ $L =~ ^[1-9][0-9]*$ ]] || { echo "lm-wiki103.sh: LENGTHS: '$L' is not a number of tokens" >&2; exit 2; }
done

# step MARKER cmd...: run unless MARKER exists (DRY_RUN=1: print).  The fairseq-pe-* tools get --force: a step
# runs again only when its marker is missing, and then replaces what an interrupted earlier run of it left
step() {
  local marker=$1; shift
  if [[ $DRY_RUN == 1 ]]; then printf '+ %s\n' "$(printf '%q ' "$@")"; return 0; fi
  [[ -f $marker ]] && { echo "skip (done): $marker"; return 0; }
  mkdir -p "$(dirname "$marker")"
  echo "[lm-wiki103 $(date +%H:%M:%S)] $*"
  "$@"
  touch "$marker"
}

step "$DATA/prepare.done" fairseq-pe-prepare-wikitext --destdir "$DATA" ${RAW_DIR:+--raw-dir "$RAW_DIR"} --force

# shellcheck disable=SC2206
EXTRA=(${TRAIN_EXTRA:-})
for L in $LENGTHS; do
  checkpoints=()
  for name in $SYSTEMS; do
    # shellcheck disable=SC2206
    pe=(${FLAGS[$name]})
    run=$OUT_ROOT/L$L/$name
    step "$run/train.done" fairseq-train "$DATA" --user-dir "$PLUGIN" --task language_modeling \
      --arch transformer_lm_pe_wiki103 "${pe[@]}" --tokens-per-sample "$L" --sample-break-mode none \
      --max-update "$MAX_UPDATE" --lr 1.0 --t-mult 2 --lr-period-updates 270000 --lr-scheduler cosine \
      --lr-shrink 0.75 --warmup-updates 16000 --warmup-init-lr 1e-07 --stop-min-lr 1e-09 --optimizer nag \
      --min-lr 0.0001 --clip-norm 0.1 --criterion adaptive_loss --max-tokens "$MAX_TOKENS" \
      --update-freq "$UPDATE_FREQ" --seed "$SEED" --skip-invalid-size-inputs-valid-test --ddp-backend legacy_ddp \
      --required-batch-size-multiple 1 --save-dir "$run" --no-epoch-checkpoints --log-format simple \
      --log-interval 100 "${DEVICE[@]}" "${EXTRA[@]}"
    checkpoints+=("$name=$run/checkpoint_best.pt")
  done
  # shellcheck disable=SC2086
  step "$OUT_ROOT/L$L/lengths.done" fairseq-pe-lm-lengths --data "$DATA" --gen-subset test --train-length "$L" \
    --multipliers $MULTIPLIERS --modes nonoverlapping sliding --stride "${STRIDE:-$L}" \
    --max-tokens "$EVAL_MAX_TOKENS" ${DEVICE[0]:+"--eval-lm-args=${DEVICE[*]}"} \
    --checkpoint "${checkpoints[@]}" --out "$OUT_ROOT/L$L/lengths" --force --resume
  # ALiBi's own sliding evaluation at L (its Appendix B and Table 7): windows of L tokens each scoring its last one
  # (fairseq's --context-window L-1), L times the cost of a non-overlapping pass
  if [[ $STRIDE_ONE == 1 ]]; then
    step "$OUT_ROOT/L$L/lengths-stride1.done" fairseq-pe-lm-lengths --data "$DATA" --gen-subset test \
      --train-length "$L" --multipliers 1 --modes sliding --stride 1 --max-tokens "$EVAL_MAX_TOKENS" \
      ${DEVICE[0]:+"--eval-lm-args=${DEVICE[*]}"} --checkpoint "${checkpoints[@]}" \
      --out "$OUT_ROOT/L$L/lengths-stride1" --force --resume
  fi
done
echo "results: $OUT_ROOT/L*/lengths/lengths.{md,json,png}"
