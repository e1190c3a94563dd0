#!/usr/bin/env bash
# The short-to-long (S2L) experiment of FLOATER §4.3 on real En-De data, at CPU scale.
#
#   bash scripts/recipes/s2l-cpu-en-de.sh [WORKDIR] [--extra-test NAME=SRC,REF ...] [more fairseq-pe-quickstart flags]
#
# 1. fairseq-pe-s2l-split on every corpus of $CORPUS_DIRS (default: all of ../shared/data/mt/en-de:
#    WMT news test sets, IWSLT14, Tatoeba, Multi30k): a joint sentencepiece model on all of it; pairs
#    whose source is shorter than $THRESHOLD ($UNIT: sentencepiece tokens, or words) train, except
#    $VALID_SIZE held back as valid and $SHORT_TEST_SIZE as "short" (an in-distribution test set); every
#    longer pair is tested, in the bins $BINS (default the paper's [80,100), [100,120), [120,140), [140,inf)).
# 2. fairseq-pe-quickstart trains one transformer_pe_tiny model per encoding and per seed of $SEEDS with
#    the same budget ($MAX_UPDATE updates of $MAX_TOKENS tokens), decodes both test sets (beam 4) and writes
#    WORKDIR/runs/results.{txt,json,png}: sacreBLEU per bin, over all long pairs and on "short" (plus any
#    --extra-test corpus), the length ratios, and the teacher-forced loss of the references per bin; with
#    several seeds, mean ± standard deviation over them, with one seed sacreBLEU's bootstrap intervals.
#
# Environment: DATA (the corpus directory), CORPUS_DIRS (space-separated folders to split; default $DATA),
# UNIT (subword), THRESHOLD (80), BINS (80,100,120,140+), SEEDS (space-separated, default 1),
# MAX_UPDATE (700), MAX_TOKENS (4096), LR (0.004), WARMUP (200), SPM_VOCAB (8000), VALID_SIZE (1000),
# SHORT_TEST_SIZE (1000), JOBS (2 systems at a time), THREADS (1 torch thread each),
# ARCH (transformer_pe_tiny), SYSTEMS (space-separated names of fairseq-pe-quickstart systems; default: the 11
# of the catalogue's group s2l-cpu-en-de, `python -m fairseq_pe.systems group s2l-cpu-en-de`; any NAME=FLAGS
# system can be given as a --systems argument instead), PYTHON (python: reads the catalogue).
# Time on 2 CPU cores with the defaults: about 1.5-2 h per seed (see docs/results.md).
# scripts/recipes/s2l-cpu-captions.sh runs it on the caption and Tatoeba pairs, where the models translate.
# A re-run reuses the split and every finished run (delete WORKDIR/runs/systems/NAME/seed-S to redo one).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${1:-s2l-cpu-work}
[ $# -gt 0 ] && shift
DATA=${DATA:-$REPO/../shared/data/mt/en-de}
read -r -a CORPORA <<< "${CORPUS_DIRS:-$DATA}"
for dir in "${CORPORA[@]}"; do
    if [ ! -d "$dir" ]; then
        echo "s2l-cpu-en-de: corpus directory $dir not found; set DATA=DIR or CORPUS_DIRS='DIR ...' (line-aligned *.en/*.de files under it)" >&2
        exit 2
    fi
done
UNIT=${UNIT:-subword}
read -r -a SEED_LIST <<< "${SEEDS:-1}"
if [ -z "${SYSTEMS:-}" ]; then  # the catalogue's group s2l-cpu-en-de (fairseq_pe/systems.py)
    SYSTEMS=$(PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python}" -m fairseq_pe.systems names s2l-cpu-en-de)
fi
read -r -a SYS <<< "$SYSTEMS"

# the split measures subword lengths with a joint sentencepiece model it trains; word lengths need none,
# and the quickstart then trains its joint model on the training split
SPLIT_SPM=() SPM=(--spm-vocab-size "${SPM_VOCAB:-8000}")
if [ "$UNIT" = subword ]; then
    SPLIT_SPM=(--spm-vocab-size "${SPM_VOCAB:-8000}") SPM=(--spm-model "$WORK/split/spm.model")
fi
if [ ! -f "$WORK/split/stats.json" ]; then
    fairseq-pe-s2l-split --corpus-dir "${CORPORA[@]}" --source-lang en --target-lang de --out "$WORK/split" \
        --unit "$UNIT" "${SPLIT_SPM[@]}" --threshold "${THRESHOLD:-80}" \
        --bins "${BINS:-80,100,120,140+}" --valid-size "${VALID_SIZE:-1000}" \
        --short-test-size "${SHORT_TEST_SIZE:-1000}" --seed 1 \
        --force  # stats.json (written last) is missing: the files of an interrupted split are replaced
else
    echo "[s2l-cpu] reusing the split in $WORK/split (stats.json)"
fi

fairseq-pe-quickstart --workdir "$WORK/runs" --data "$WORK/split" --source-lang en --target-lang de \
    "${SPM[@]}" --length-unit "$UNIT" --buckets "${BINS:-80,100,120,140+}" \
    --extra-test "short=$WORK/split/test-short.en,$WORK/split/test-short.de" \
    --arch "${ARCH:-transformer_pe_tiny}" --max-update "${MAX_UPDATE:-700}" --max-tokens "${MAX_TOKENS:-4096}" \
    --lr "${LR:-0.004}" --warmup "${WARMUP:-200}" --beam 4 --seeds "${SEED_LIST[@]}" \
    --jobs "${JOBS:-2}" --threads "${THREADS:-1}" --progress-seconds 120 \
    --systems "${SYS[@]}" "$@"
