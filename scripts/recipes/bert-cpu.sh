#!/usr/bin/env bash
# BERT-style comparison of position encodings at CPU scale (the "BERT-style pretraining and fine-tuning on CPU" table of docs/results.md).
#
# For each encoding: masked-LM pretraining of roberta_pe_tiny (4 layers x 128) on ../shared/data/mono/en
# at 128 tokens (the table has --max-positions 512 rows, as BERT's first phase), then two fine-tunings
# from that checkpoint, with the same budget, data order and seed for every encoding:
#   * SST-2 (fairseq's sentence_prediction), accuracy on the dev set (872 sentences);
#   * SQuAD v1.1 (fairseq_pe's span_prediction) on the 44-article training subset at up to 512 tokens
#     (document stride 128), exact match / F1 on every DEV_EVERY-th article of the official dev set
#     (default 5: 10 of its 48 articles, 2,524 questions; DEV_EVERY=1 for all 10,570) and F1 by where the
#     gold answer starts (< 128: positions seen in pretraining; >= 128: not seen).
# Every pipeline runs once per seed of SEEDS (pretraining and fine-tunings with that seed); the table gives
# mean ± standard deviation over the seeds, or says that it has one seed.
# Outputs: OUT/results.{md,json,png}.  Every step is skipped when its output exists (rerun to resume); the table
# refuses to combine the seeds of a system whose checkpoints hold different resolved --pe-* options (a run left
# from other defaults or code), naming the option and the files to remove.
#
# Usage: scripts/recipes/bert-cpu.sh            (about 2 h per seed on 2 CPU cores with JOBS=2)
# Environment: OUT (default ./bert-cpu), SHARED (../shared/data), SYSTEMS (subset of the names below),
#   EXTRA_SYSTEMS (more systems: lines "NAME FLAGS..."),
#   SEEDS (space-separated, default "1"; e.g. SEEDS="1 2 3"), JOBS (pipelines run at once, default 1),
#   FINETUNE (the fine-tunings after pretraining, default "sst2 squad"; e.g. FINETUNE=sst2 skips SQuAD,
#   whose columns then count only the seeds that have it),
#   PRETRAIN_UPDATES (1200), SST2_UPDATES (600), SQUAD_UPDATES (600), DEV_EVERY (5), VOCAB (8000),
#   DRY_RUN=1 (print the commands only), PYTHON.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python}
OUT=${OUT:-$PWD/bert-cpu}
SHARED=${SHARED:-$REPO/../shared/data}
PRETRAIN_UPDATES=${PRETRAIN_UPDATES:-1200}
SST2_UPDATES=${SST2_UPDATES:-600}
SQUAD_UPDATES=${SQUAD_UPDATES:-600}
SEEDS=${SEEDS:-${SEED:-1}}  # SEED: the one seed of earlier versions
VOCAB=${VOCAB:-8000}
DEV_EVERY=${DEV_EVERY:-5}
JOBS=${JOBS:-1}
DRY_RUN=${DRY_RUN:-0}
FINETUNE=${FINETUNE-sst2 squad}
for t in $FINETUNE; do
  [[ $t == sst2 || $t == squad ]] || { echo "bert-cpu.sh: unknown fine-tuning '$t' in FINETUNE; choose from: sst2 squad" >&2; exit 2; }
done
PLUGIN=$REPO/fairseq_pe
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1

# the systems: the catalogue's group bert-cpu (fairseq_pe/systems.py, `python -m fairseq_pe.systems group bert-cpu`)
case ${BASH_SOURCE[0]} in */*) CATALOGUE_REPO=${BASH_SOURCE[0]%/*}/../.. ;; *) CATALOGUE_REPO=../.. ;; esac
catalogue() { PYTHONPATH="$CATALOGUE_REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m fairseq_pe.systems "$@"; }
declare -A FLAGS=()
ORDER=""
CATALOGUE=$(catalogue group bert-cpu) || { echo "bert-cpu.sh: $PYTHON cannot read fairseq_pe/systems.py" >&2; exit 2; }
while read -r name flags; do FLAGS[$name]=$flags; ORDER="${ORDER:+$ORDER }$name"; done <<< "$CATALOGUE"
# EXTRA_SYSTEMS: more systems, one per line, "NAME FLAGS..." (e.g. $'ape-sin-1 --pe-absolute sinusoidal
# --pe-sinusoid-scale 1'); they join the default SYSTEMS
while read -r name flags; do
  [[ -n $name ]] || continue
  [[ -z ${FLAGS[$name]:-} ]] || { echo "bert-cpu.sh: EXTRA_SYSTEMS: '$name' is a system already; choose another name" >&2; exit 2; }
  [[ -n $flags ]] || { echo "bert-cpu.sh: EXTRA_SYSTEMS: '$name' has no flags (a line is 'NAME FLAGS...')" >&2; exit 2; }
  FLAGS[$name]=$flags
  ORDER="$ORDER $name"
done <<< "${EXTRA_SYSTEMS:-}"
SYSTEMS=${SYSTEMS:-$ORDER}
# a name of before the catalogue (ape-sin, ape-lsin, ...) is accepted as the catalogue's name of the same flags
RESOLVED=""
for s in $SYSTEMS; do
  if [[ -z ${FLAGS[$s]:-} ]] && c=$(catalogue canonical "$s" 2>/dev/null) && [[ -n ${FLAGS[$c]:-} ]]; then
    echo "bert-cpu.sh: SYSTEMS: '$s' is called '$c' in fairseq_pe/systems.py; running it as $c" >&2
    s=$c
  fi
  [[ -n ${FLAGS[$s]:-} ]] || { echo "bert-cpu.sh: unknown system '$s' in SYSTEMS; choose from: $ORDER" >&2; exit 2; }
  RESOLVED="${RESOLVED:+$RESOLVED }$s"
done
SYSTEMS=$RESOLVED

run() {  # run a command (DRY_RUN=1: print it), its output to a log file
  local log=$1; shift
  if [[ $DRY_RUN == 1 ]]; then printf '+ %s\n' "$(printf '%q ' "$@")"; return 0; fi
  echo "[bert-cpu $(date +%H:%M:%S)] $* > $log"
  "$@" > "$log" 2>&1 || { echo "bert-cpu.sh: failed, see $log:" >&2; tail -n 30 "$log" >&2; return 1; }
}

if [[ $DRY_RUN != 1 ]]; then mkdir -p "$OUT"; cd "$OUT"; fi

# ---- data: sentencepiece + fairseq-preprocess; GLUE and SQuAD reuse the pretraining dictionary
# (each step runs while the file that its tool writes last is missing: --force replaces what an
# interrupted earlier run left)
[[ -f mono-bin/train.bin ]] || run prepare-mono.log fairseq-pe-prepare-mono --input "$SHARED/mono/en" \
  --destdir mono-bin --vocab-size "$VOCAB" --workers 2 --force
[[ -f glue/SST-2-bin/task.json ]] || run prepare-glue.log fairseq-pe-prepare-glue --glue-dir "$SHARED/glue" \
  --tasks SST-2 --spm-model mono-bin/spm.model --dict mono-bin/dict.txt --destdir glue --force
# the SQuAD dev articles evaluated: every DEV_EVERY-th one, whole (all their paragraphs and questions)
[[ -f squad-dev.json ]] || run squad-dev.log "$PYTHON" -c 'import json, sys
d = json.load(open(sys.argv[1]))
d["data"] = d["data"][::int(sys.argv[3])]
json.dump(d, open(sys.argv[2], "w"))
print(len(d["data"]), "articles,", sum(len(p["qas"]) for a in d["data"] for p in a["paragraphs"]), "questions")' \
  "$SHARED/squad/dev-v1.1.json" squad-dev.json "$DEV_EVERY"
[[ -f squad-bin/prepare.json ]] || run prepare-squad.log fairseq-pe-prepare-squad \
  --train "$SHARED/squad/squad_v1.1_train_subset44.json" --valid squad-dev.json \
  --spm-model mono-bin/spm.model --dict mono-bin/dict.txt --destdir squad-bin --max-length 512 \
  --doc-stride 128 --max-query-length 64 --workers 2 --force

pipeline() {  # pipeline NAME SEED: the runs of one encoding and seed, in folders and files NAME-sSEED
  local name=$1 SEED=$2 tag=$1-s$2
  # shellcheck disable=SC2086
  local pe=(${FLAGS[$name]})
  local common=(--user-dir "$PLUGIN" --arch roberta_pe_tiny "${pe[@]}" --optimizer adam --adam-betas '(0.9,0.98)'
                --adam-eps 1e-6 --weight-decay 0.01 --clip-norm 1.0 --lr-scheduler polynomial_decay
                --dropout 0.1 --attention-dropout 0.1 --seed "$SEED" --cpu --num-workers 0
                --no-epoch-checkpoints --log-format simple --log-interval 50)
  if [[ ! -f pt-$tag/train.done || $DRY_RUN == 1 ]]; then
    run "pt-$tag.log" fairseq-train mono-bin --task masked_lm --criterion masked_lm "${common[@]}" \
      --tokens-per-sample 128 --max-positions 512 --lr 1e-3 --warmup-updates $((PRETRAIN_UPDATES / 12)) \
      --total-num-update "$PRETRAIN_UPDATES" --max-update "$PRETRAIN_UPDATES" --batch-size 32 --save-dir "pt-$tag"
    [[ $DRY_RUN == 1 ]] || touch "pt-$tag/train.done"
  fi
  if [[ " $FINETUNE " == *" sst2 "* && ! -f sst2-$tag.json ]]; then
    local task_args
    task_args=$("$PYTHON" -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["fairseq_train_args"]))' \
      glue/SST-2-bin/task.json 2>/dev/null || echo "--task sentence_prediction --num-classes 2 (from task.json)")
    # shellcheck disable=SC2086
    run "sst2-$tag.log" fairseq-train glue/SST-2-bin $task_args "${common[@]}" \
      --restore-file "pt-$tag/checkpoint_last.pt" --lr 2e-4 --warmup-updates $((SST2_UPDATES * 6 / 100 + 1)) \
      --total-num-update "$SST2_UPDATES" --max-update "$SST2_UPDATES" --batch-size 32 \
      --disable-validation --save-dir "sst2-$tag"
    run "sst2-$tag.eval.log" fairseq-pe-glue-eval glue/SST-2-bin --path "sst2-$tag/checkpoint_last.pt" \
      --user-dir "$PLUGIN" --split valid --cpu --quiet --out "sst2-$tag" --force
  fi
  if [[ " $FINETUNE " == *" squad "* && ! -f squad-$tag.scores.json ]]; then
    run "squad-$tag.log" fairseq-train squad-bin --task span_prediction --criterion span_prediction "${common[@]}" \
      --max-positions 512 --restore-file "pt-$tag/checkpoint_last.pt" --reset-optimizer --reset-dataloader \
      --reset-meters --lr 3e-4 --warmup-updates $((SQUAD_UPDATES * 6 / 100 + 1)) --total-num-update "$SQUAD_UPDATES" --max-update "$SQUAD_UPDATES" \
      --batch-size 16 --required-batch-size-multiple 1 --disable-validation --save-dir "squad-$tag"
    run "squad-$tag.predict.log" fairseq-pe-squad-predict squad-bin --path "squad-$tag/checkpoint_last.pt" \
      --split valid --json squad-dev.json --out "squad-$tag" --cpu --force
  fi
}

running=0
for seed in $SEEDS; do
  for name in $SYSTEMS; do
    if [[ $JOBS -gt 1 && $DRY_RUN != 1 ]]; then
      pipeline "$name" "$seed" &
      running=$((running + 1))
      if [[ $running -ge $JOBS ]]; then wait -n; running=$((running - 1)); fi
    else
      pipeline "$name" "$seed"
    fi
  done
done
wait

SYSTEM_FLAGS=()
for name in $SYSTEMS; do SYSTEM_FLAGS+=("$name=${FLAGS[$name]}"); done
run table.log "$PYTHON" "$REPO/scripts/recipes/bert_cpu_table.py" --out "$OUT" --squad-json "${OUT}/squad-dev.json" \
  --systems "${SYSTEM_FLAGS[@]}" --seeds $SEEDS
[[ $DRY_RUN == 1 ]] || cat "$OUT/results.md"
