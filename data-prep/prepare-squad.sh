#!/usr/bin/env bash
# SQuAD v1.1 / v2.0 for --task span_prediction: sentencepiece with character offsets, windows of
# --max-length tokens --doc-stride apart, "<s> question </s> </s> context </s>" features binarised
# with the pretrained model's dictionary.  Thin wrapper around fairseq_pe/data_prep/squad.py
# (installed as `fairseq-pe-prepare-squad`); see `--help` for the outputs and counts.
#
# Usage: data-prep/prepare-squad.sh [--train JSON] [--valid JSON] [--test JSON] \
#            --spm-model DIR/spm.model --dict DIR/dict.txt --destdir DIR \
#            [--max-length 512] [--doc-stride 128] [--max-query-length 64] [--version auto|1.1|2.0] [--workers N]
# e.g.   data-prep/prepare-squad.sh --train squad_v1.1_train_subset44.json --valid dev-v1.1.json \
#            --spm-model mono/spm.model --dict mono/dict.txt --destdir squad-bin --max-length 512
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m fairseq_pe.data_prep.squad "$@"
