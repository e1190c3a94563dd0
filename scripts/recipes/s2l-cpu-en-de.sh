#!/usr/bin/env bash
# The short-to-long (S2L) experiment of FLOATER §4.3 on real En-De data, at CPU scale.
#
#   bash scripts/recipes/s2l-cpu-en-de.sh [WORKDIR] [--extra-test NAME=SRC,REF ...] [more fairseq-pe-quickstart flags]
#
# 1. fairseq-pe-s2l-split on every corpus of ../shared/data/mt/en-de (WMT news test sets,
#    IWSLT14, Tatoeba, Multi30k): a joint 8k sentencepiece model on all of it; pairs whose source
#    has < 80 sentencepiece tokens train, except 1,000 held back as valid and 1,000 as "short"
#    (an in-distribution test set); every pair with >= 80 tokens is tested, in the paper's bins
#    [80,100), [100,120), [120,140), [140,inf).
# 2. fairseq-pe-quickstart trains one transformer_pe_tiny model per encoding for the same budget
#    ($MAX_UPDATE updates of $MAX_TOKENS tokens, same seed), decodes both test sets (beam 4) and
#    writes WORKDIR/runs/results.{txt,json,png}: sacreBLEU per bin, over all long pairs, and on
#    "short" plus any --extra-test corpus (raw source/reference files, one column each).
#
# Environment: DATA (the corpus directory), MAX_UPDATE (700), MAX_TOKENS (4096), LR (0.004),
# WARMUP (200), SPM_VOCAB (8000), VALID_SIZE (1000), SHORT_TEST_SIZE (1000),
# JOBS (2 systems at a time), THREADS (1 torch thread each),
# ARCH (transformer_pe_tiny), SYSTEMS (space-separated names of fairseq-pe-quickstart systems; default:
# the 11 below; any NAME=FLAGS system can be given as a --systems argument instead).
# Time on 2 CPU cores with the defaults: about 1.5-2 h (measured: 10 of the 11 systems in 2 h while
# the cores were shared with other jobs; see the README).
# A re-run reuses the split and every finished system (delete WORKDIR/runs/systems/NAME to redo one).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${1:-s2l-cpu-work}
[ $# -gt 0 ] && shift
DATA=${DATA:-$REPO/../shared/data/mt/en-de}
if [ ! -d "$DATA" ]; then
    echo "s2l-cpu-en-de: corpus directory $DATA not found; set DATA=DIR (line-aligned *.en/*.de files under it)" >&2
    exit 2
fi
DEFAULT_SYSTEMS=(
    "floater"                      # FLOATER at every block (--pe-absolute floater --pe-all-blocks)
    "rpe-learned" "rpe-sinusoidal" "rpe-learnable-sin"
    "ape-sin+rpe-learned"          # --pe-absolute sinusoidal --pe-relative learned: Shaw et al. 2018's pairing
    "rope" "alibi"
    "none" "ape-learned" "ape-sinusoidal" "ape-learnable-sin"
)
if [ -n "${SYSTEMS:-}" ]; then read -r -a SYS <<< "$SYSTEMS"; else SYS=("${DEFAULT_SYSTEMS[@]}"); fi

if [ ! -f "$WORK/split/stats.json" ]; then
    fairseq-pe-s2l-split --corpus-dir "$DATA" --source-lang en --target-lang de --out "$WORK/split" \
        --unit subword --spm-vocab-size "${SPM_VOCAB:-8000}" --threshold 80 --bins 80,100,120,140+ \
        --valid-size "${VALID_SIZE:-1000}" --short-test-size "${SHORT_TEST_SIZE:-1000}" --seed 1 \
        --force  # stats.json (written last) is missing: the files of an interrupted split are replaced
else
    echo "[s2l-cpu] reusing the split in $WORK/split (stats.json)"
fi

fairseq-pe-quickstart --workdir "$WORK/runs" --data "$WORK/split" --source-lang en --target-lang de \
    --spm-model "$WORK/split/spm.model" --length-unit subword --buckets 80,100,120,140+ \
    --extra-test "short=$WORK/split/test-short.en,$WORK/split/test-short.de" \
    --arch "${ARCH:-transformer_pe_tiny}" --max-update "${MAX_UPDATE:-700}" --max-tokens "${MAX_TOKENS:-4096}" \
    --lr "${LR:-0.004}" --warmup "${WARMUP:-200}" --beam 4 --seed 1 \
    --jobs "${JOBS:-2}" --threads "${THREADS:-1}" --progress-seconds 120 \
    --systems "${SYS[@]}" "$@"
