#!/usr/bin/env bash
# Wang et al. (ICLR 2021), "On Position Embeddings in BERT": pretrain with each position encoding at
# 128 tokens, continue at 512, then fine-tune on GLUE and SQuAD, with the settings of their Table 4:
#
#   phase                 max len  epochs  lr     batch  weight decay
#   BERT-base, continued  128      5       5e-5   64     0.01   (from a pretrained checkpoint)
#   BERT-base, continued  512      2       5e-5   512    0.01
#   BERT-medium, scratch  128      10      5e-5   128    0.01   (8 layers)
#   BERT-medium, scratch  512      2       5e-5   512    0.01
#   GLUE                  128      3       2e-5   32     0.01
#   SQuAD                 384      3       3e-5   32     0.01
#
# Usage: scripts/recipes/bert-pretrain.sh TEXT_BIN [medium|base]
#   TEXT_BIN: fairseq-pe-prepare-mono output (dict.txt, spm.model, train/valid), e.g. from Wikipedia+BookCorpus.
#   medium: roberta_pe_medium from scratch (their Fig. 1 runs).  base: continue a pretrained RoBERTa with the
#     encoding replaced (fairseq-pe-warm-start-roberta; set BASE_CHECKPOINT=model.pt; TEXT_BIN must be binarised
#     with that checkpoint's dictionary); FLOATER is then ape-learned+floater-bias: it keeps the learned table and
#     adds FLOATER's Q/K/V biases, trains only the dynamics for FLOATER_EPOCHS (default 1) with the body frozen (FLOATER §4.2), then
#     fine-tunes.
#   The 512 phase restores the 128 phase's checkpoint: tables are built with --max-positions 512 from the start
#   (BERT's practice; rows 128-511 are trained in the second phase only).
# Environment: OUT_ROOT (./bert-runs), GLUE_DIR (../shared/data/glue or the GLUE download), SQUAD_DIR (with
#   train-v1.1.json and dev-v1.1.json), GLUE_TASKS (CoLA,SST-2,MRPC,STS-B,RTE), SYSTEMS (subset of the names
#   below), NUM_GPUS (default: visible GPUs), BATCH_PER_GPU (32: update frequency makes up the table's batch),
#   SEED (1), DRY_RUN=1 (print the commands), ALLOW_CPU=1, PYTHON.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python}
TEXT_BIN=${1:?usage: bert-pretrain.sh TEXT_BIN [medium|base]}
MODE=${2:-medium}
OUT_ROOT=${OUT_ROOT:-$PWD/bert-runs}
GLUE_DIR=${GLUE_DIR:-$REPO/../shared/data/glue}
SQUAD_DIR=${SQUAD_DIR:-$REPO/../shared/data/squad}
GLUE_TASKS=${GLUE_TASKS:-CoLA,SST-2,MRPC,STS-B,RTE}
SEED=${SEED:-1}
DRY_RUN=${DRY_RUN:-0}
BATCH_PER_GPU=${BATCH_PER_GPU:-32}
FLOATER_EPOCHS=${FLOATER_EPOCHS:-1}
PLUGIN=$REPO/fairseq_pe
case $MODE in
  medium) ARCH=roberta_pe_medium; EPOCHS_128=10; BATCH_128=128 ;;
  base) ARCH=roberta_pe_base; EPOCHS_128=5; BATCH_128=64
        [[ $DRY_RUN == 1 ]] || [[ -f ${BASE_CHECKPOINT:-} ]] || { echo "bert-pretrain.sh: base needs BASE_CHECKPOINT=path/to/model.pt" >&2; exit 2; } ;;
  *) echo "bert-pretrain.sh: mode must be medium or base, not '$MODE'" >&2; exit 2 ;;
esac
if [[ -z ${NUM_GPUS:-} ]]; then
  if [[ $DRY_RUN == 1 ]]; then NUM_GPUS=1; else NUM_GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())'); fi
fi
DEVICE=()
if [[ $NUM_GPUS == 0 ]]; then
  [[ ${ALLOW_CPU:-0} == 1 ]] || { echo "bert-pretrain.sh: no GPU found (set ALLOW_CPU=1 to run on the CPU anyway)" >&2; exit 2; }
  NUM_GPUS=1; DEVICE=(--cpu)
else
  DEVICE=(--fp16)
fi
update_freq() { echo $(( ($1 + BATCH_PER_GPU * NUM_GPUS - 1) / (BATCH_PER_GPU * NUM_GPUS) )); }

# the systems: the catalogue's group bert-pretrain (fairseq_pe/systems.py, `python -m fairseq_pe.systems group bert-pretrain`)
case ${BASH_SOURCE[0]} in */*) CATALOGUE_REPO=${BASH_SOURCE[0]%/*}/../.. ;; *) CATALOGUE_REPO=../.. ;; esac
catalogue() { PYTHONPATH="$CATALOGUE_REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m fairseq_pe.systems "$@"; }
declare -A FLAGS=()
ORDER=""
GROUP=bert-pretrain
[[ $MODE == base ]] && GROUP=bert-pretrain-base  # FLOATER as Q/K/V biases on the pretrained learned table
CATALOGUE=$(catalogue group $GROUP) || { echo "bert-pretrain.sh: $PYTHON cannot read fairseq_pe/systems.py" >&2; exit 2; }
while read -r name flags; do FLAGS[$name]=$flags; ORDER="${ORDER:+$ORDER }$name"; done <<< "$CATALOGUE"
SYSTEMS=${SYSTEMS:-$ORDER}
# a name of before the catalogue (ape-sin, ape-lsin, ...) is accepted as the catalogue's name of the same flags
RESOLVED=""
for s in $SYSTEMS; do
  if [[ -z ${FLAGS[$s]:-} ]] && c=$(catalogue canonical "$s" 2>/dev/null) && [[ -n ${FLAGS[$c]:-} ]]; then
    echo "bert-pretrain.sh: SYSTEMS: '$s' is called '$c' in fairseq_pe/systems.py; running it as $c" >&2
    s=$c
  fi
  [[ -n ${FLAGS[$s]:-} ]] || { echo "bert-pretrain.sh: unknown system '$s'; choose from: $ORDER" >&2; exit 2; }
  RESOLVED="${RESOLVED:+$RESOLVED }$s"
done
SYSTEMS=$RESOLVED

# step MARKER cmd...: run unless MARKER exists (DRY_RUN=1: print).  The fairseq-pe-* tools below get
# --force: a step runs again only when its marker is missing, and then replaces what an interrupted
# earlier run of it left behind
step() {
  local marker=$1; shift
  if [[ $DRY_RUN == 1 ]]; then printf '+ %s\n' "$(printf '%q ' "$@")"; return 0; fi
  [[ -f $marker ]] && { echo "skip (done): $marker"; return 0; }
  mkdir -p "$(dirname "$marker")"
  echo "[bert-pretrain $(date +%H:%M:%S)] $*"
  "$@"
  touch "$marker"
}

step "$OUT_ROOT/data/glue.done" fairseq-pe-prepare-glue --glue-dir "$GLUE_DIR" --tasks "$GLUE_TASKS" \
  --spm-model "$TEXT_BIN/spm.model" --dict "$TEXT_BIN/dict.txt" --destdir "$OUT_ROOT/data/glue" --force
step "$OUT_ROOT/data/squad.done" fairseq-pe-prepare-squad --train "$SQUAD_DIR/train-v1.1.json" \
  --valid "$SQUAD_DIR/dev-v1.1.json" --spm-model "$TEXT_BIN/spm.model" --dict "$TEXT_BIN/dict.txt" \
  --destdir "$OUT_ROOT/data/squad" --max-length 384 --doc-stride 128 --max-query-length 64 --force

OPT=(--optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-6 --weight-decay 0.01 --clip-norm 0.0
     --lr-scheduler polynomial_decay --dropout 0.1 --attention-dropout 0.1 --seed "$SEED" --no-epoch-checkpoints
     --log-format simple --log-interval 100 "${DEVICE[@]}")
for name in $SYSTEMS; do
  # shellcheck disable=SC2206
  pe=(${FLAGS[$name]})
  run=$OUT_ROOT/$MODE/$name
  mlm=(fairseq-train "$TEXT_BIN" --user-dir "$PLUGIN" --task masked_lm --criterion masked_lm --arch "$ARCH" "${pe[@]}"
       --max-positions 512 --lr 5e-5 "${OPT[@]}")
  start=()
  if [[ $MODE == base ]]; then
    step "$run/warm-start.done" fairseq-pe-warm-start-roberta "${BASE_CHECKPOINT:-model.pt}" "$run/warm-start.pt" \
      --data "$TEXT_BIN" --force "${pe[@]}"
    start=(--restore-file "$run/warm-start.pt" --reset-optimizer --reset-dataloader --reset-meters)
    if [[ " ${pe[*]} " == *" --pe-floater-bias "* ]]; then  # FLOATER §4.2: train the dynamics only, the body frozen
      step "$run/dynamics.done" "${mlm[@]}" "${start[@]}" --pe-floater-freeze-body --tokens-per-sample 512 \
        --batch-size "$BATCH_PER_GPU" --update-freq "$(update_freq 256)" --max-epoch "$FLOATER_EPOCHS" \
        --warmup-updates 1000 --save-dir "$run/dynamics"
      start=(--restore-file "$run/dynamics/checkpoint_last.pt" --reset-optimizer --reset-dataloader --reset-meters)
    fi
  fi
  step "$run/p128.done" "${mlm[@]}" "${start[@]}" --tokens-per-sample 128 --batch-size "$BATCH_PER_GPU" \
    --update-freq "$(update_freq $BATCH_128)" --max-epoch "$EPOCHS_128" --warmup-updates 10000 --save-dir "$run/p128"
  step "$run/p512.done" "${mlm[@]}" --restore-file "$run/p128/checkpoint_last.pt" --reset-optimizer \
    --reset-dataloader --reset-meters --tokens-per-sample 512 --batch-size "$BATCH_PER_GPU" \
    --update-freq "$(update_freq 512)" --max-epoch 2 --warmup-updates 1000 --save-dir "$run/p512"
  for task in ${GLUE_TASKS//,/ }; do
    bin=$OUT_ROOT/data/glue/$task-bin
    if [[ $DRY_RUN == 1 ]]; then task_args=("--task" "sentence_prediction" "(flags of $bin/task.json)")
    else mapfile -t task_args < <("$PYTHON" -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["fairseq_train_args"]))' "$bin/task.json"); fi
    step "$run/glue-$task.done" fairseq-train "$bin" --user-dir "$PLUGIN" --arch "$ARCH" "${pe[@]}" "${task_args[@]}" \
      --restore-file "$run/p512/checkpoint_last.pt" --lr 2e-5 --batch-size 32 --max-epoch 3 --warmup-updates 0 \
      "${OPT[@]}" --save-dir "$run/glue-$task"
    step "$run/glue-$task.eval.done" fairseq-pe-glue-eval "$bin" --path "$run/glue-$task/checkpoint_last.pt" \
      --user-dir "$PLUGIN" --split valid --out "$run/glue-$task" --force
  done
  step "$run/squad.done" fairseq-train "$OUT_ROOT/data/squad" --user-dir "$PLUGIN" --task span_prediction \
    --criterion span_prediction --arch "$ARCH" "${pe[@]}" --max-positions 512 \
    --restore-file "$run/p512/checkpoint_last.pt" --reset-optimizer --reset-dataloader --reset-meters \
    --lr 3e-5 --batch-size 32 --max-epoch 3 --warmup-updates 0 --required-batch-size-multiple 1 "${OPT[@]}" \
    --save-dir "$run/squad"
  step "$run/squad.eval.done" fairseq-pe-squad-predict "$OUT_ROOT/data/squad" --path "$run/squad/checkpoint_last.pt" \
    --split valid --json "$SQUAD_DIR/dev-v1.1.json" --out "$run/squad" --force
done
echo "results: $OUT_ROOT/$MODE/*/glue-*.json and */squad.scores.json"
