#!/usr/bin/env bash
# CoPE's counting task (Golovneva et al. 2024, §5.2; the reference's generator: facebookresearch/RAM,
# projects/cope/scripts/count_data_gen.py) at CPU scale: language models that answer "print a" after a program of
# assignments, increments and many pass statements, in the training lengths and past them.
#
#   bash scripts/recipes/lm-cpu-counting.sh [WORKDIR]
#
# 1. Data: fairseq-pe-counting data (NVARS variables, default 3 as the reference; TRAIN programs, default 10000 as
#    the reference, of 3..MAX_STEPS statements, default 64, the reference's 512 scaled to the CPU; 1000 valid; 1000
#    test programs in each of test-1x [3, MAX_STEPS], test-2x (MAX_STEPS, 2·MAX_STEPS], test-4x (2·MAX_STEPS,
#    4·MAX_STEPS], and their twins test-Kx-small of the same lengths whose answers are at most 4, as 89% of the training
#    answers), binarised by fairseq-preprocess --only-source (a word-level dictionary): WORKDIR/raw, WORKDIR/data (the
#    test splits are fairseq's test, test1, test2, the -small ones test3, test4, test5).
# 2. Training: one $ARCH (default transformer_lm_pe_tiny: 2 layers, 64 dims, 4 heads) per system of $SYSTEMS and seed
#    of $SEEDS, fairseq's language_modeling task, one program per sample (--sample-break-mode eos), the loss on the
#    answer only (--criterion answer_cross_entropy: the reference's --train-on answer), MAX_UPDATE updates (default
#    3000) of MAX_TOKENS tokens (2048), Adam (0.9, 0.98), lr LR (0.002) after WARMUP (100) updates, inverse square
#    root, dropout 0.1, weight decay 0.01, tied embeddings, --tokens-per-sample the longest test program's tokens
#    (the models' positions reach every test program; training programs are at most about a quarter of it):
#    WORKDIR/runs/NAME-sSEED; JOBS runs at a time (2), THREADS torch threads each (1).
# 3. Scoring: fairseq-pe-counting score, every test answer through fairseq-validate (greedy exact match), mean ± sd
#    over the seeds and every seed's value: WORKDIR/score/counting.{md,json,png}.
#
# Systems: SYSTEMS (catalogue names; default the catalogue's group "lm-cpu-counting": the paper's three, a learned
# absolute table, a learned relative one (Shaw's, the reference's "rel") and CoPE, beside no positions, RoPE, ALiBi
# and FoX: `python -m fairseq_pe.systems names lm-cpu-counting`).
# A re-run resumes: finished runs (their train.done) are skipped, and the scoring while its checkpoints are the same;
# delete WORKDIR/runs/NAME-sSEED to redo one.
# Environment: NVARS, MAX_STEPS, TRAIN, ARCH, SYSTEMS, SEEDS (1 2 3), MAX_UPDATE, MAX_TOKENS, LR, WARMUP, JOBS, THREADS,
# PYTHON (python: reads the catalogue), DRY_RUN=1 (print the commands).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python}
WORK=${1:-lm-cpu-counting-work}
NVARS=${NVARS:-3}
MAX_STEPS=${MAX_STEPS:-64}
TRAIN=${TRAIN:-10000}
ARCH=${ARCH:-transformer_lm_pe_tiny}
SEEDS=${SEEDS:-1 2 3}
MAX_UPDATE=${MAX_UPDATE:-3000}
MAX_TOKENS=${MAX_TOKENS:-2048}
LR=${LR:-0.002}
WARMUP=${WARMUP:-100}
JOBS=${JOBS:-2}
THREADS=${THREADS:-1}
DRY_RUN=${DRY_RUN:-0}
PLUGIN=$REPO/fairseq_pe
export PYTHONUNBUFFERED=1

PROG=lm-cpu-counting.sh TAG=lm-cpu-counting
# shellcheck source=scripts/recipes/lm_cpu_common.sh
source "$REPO/scripts/recipes/lm_cpu_common.sh"

SYSTEMS=${SYSTEMS:-$(catalogue names lm-cpu-counting)} || die "$PYTHON cannot read fairseq_pe/systems.py"
read_systems
for var in NVARS MAX_STEPS TRAIN MAX_UPDATE MAX_TOKENS WARMUP JOBS THREADS; do
  [[ ${!var} =~ ^[0-9]+$ ]] || die "$var=${!var}: expected a whole number"
done

# ---- 1. data (each step runs while the file it writes last is missing; --force replaces what an interrupted run left)
if [[ -f $WORK/raw/stats.json ]]; then
  log "reusing the programs in $WORK/raw"
else
  run "$WORK/logs/data.log" fairseq-pe-counting data --out "$WORK/raw" --nvars "$NVARS" --max-steps "$MAX_STEPS" \
    --train "$TRAIN" --length-factors 1 2 4 --seed 1 --force
fi
TESTS=("$WORK"/raw/test-{1x,2x,4x,1x-small,2x-small,4x-small}.txt)
if [[ -f $WORK/data/preprocess.done ]]; then
  log "reusing the binarised data in $WORK/data"
else
  [[ $DRY_RUN == 1 ]] || rm -rf "$WORK/data"
  run "$WORK/logs/preprocess.log" fairseq-preprocess --only-source --trainpref "$WORK/raw/train.txt" \
    --validpref "$WORK/raw/valid.txt" \
    --testpref "$(IFS=,; echo "${TESTS[*]}")" \
    --destdir "$WORK/data" --workers 1
  [[ $DRY_RUN == 1 ]] || touch "$WORK/data/preprocess.done"
fi
# every program fits the models' positions: the longest of any split, </s> included
if [[ $DRY_RUN == 1 ]]; then
  TOKENS_PER_SAMPLE=$((MAX_STEPS * 4 * 4 + 3))  # no stats yet: a bound (4 tokens a statement at most)
else
  TOKENS_PER_SAMPLE=$("$PYTHON" -c 'import json, sys; s = json.load(open(sys.argv[1]))["splits"]; print(max(v["tokens_max"] for v in s.values()))' "$WORK/raw/stats.json")
fi

# ---- 2. training, JOBS runs at a time
train_systems "$MAX_UPDATE updates" --tokens-per-sample "$TOKENS_PER_SAMPLE" --sample-break-mode eos \
  --criterion answer_cross_entropy --log-interval 500 --validate-interval-updates 1000

# ---- 3. scoring (skipped while its checkpoints are the same)
OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS once_per_checkpoints scored "$WORK/score" counting.json \
  "$WORK/logs/score.log" fairseq-pe-counting score --data "$WORK/data" --checkpoint "${CHECKPOINTS[@]}" \
  --subsets 1x=test 2x=test1 4x=test2 1x-small=test3 2x-small=test4 4x-small=test5 --validate-args=--cpu \
  --out "$WORK/score" --force
[[ $DRY_RUN == 1 ]] || { cat "$WORK/score/counting.md"; log "wrote $WORK/score/counting.{md,json,png}"; }
