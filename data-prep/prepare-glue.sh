#!/usr/bin/env bash
# GLUE (SST-2, CoLA, MRPC, RTE, STS-B, WNLI) from the GLUE tsv files to the inputs of fairseq's
# sentence_prediction task: sentencepiece pieces binarised with the pretraining dictionary
# (DESTDIR/TASK-bin/input0, input1 for pairs), labels (label/; STS-B: raw scores / 5 for
# --regression-target) and DESTDIR/TASK-bin/task.json with the recommended fine-tuning flags.
# Thin wrapper around fairseq_pe/data_prep/glue.py (installed as `fairseq-pe-prepare-glue`);
# see `--help` for the formats, MRPC's held-out dev split and every option.
#
# Usage: data-prep/prepare-glue.sh --glue-dir DIR --spm-model M --dict DICT --destdir DIR
#            [--tasks SST-2,CoLA,MRPC,RTE,STS-B,WNLI] [--max-positions 512] [--limit N] [--workers N]
#            [--mrpc-dev-size 408] [--mrpc-dev-seed 1] [--mrpc-dev-ids FILE]
# e.g.   data-prep/prepare-glue.sh --glue-dir ../shared/data/glue --spm-model mono/spm.model \
#            --dict mono/dict.txt --destdir glue-bin
# Evaluate a fine-tuned checkpoint: fairseq-pe-glue-eval glue-bin/SST-2-bin --path CKPT --split valid
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m fairseq_pe.data_prep.glue "$@"
