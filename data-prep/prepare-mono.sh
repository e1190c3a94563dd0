#!/usr/bin/env bash
# Raw English text -> sentencepiece -> fairseq-preprocess --only-source: masked-LM pretraining data for
# roberta_pe (fairseq-train --task masked_lm).  Thin wrapper around fairseq_pe/data_prep/mono.py (installed as
# `fairseq-pe-prepare-mono`); see `--help` for every option.
#
# Usage: data-prep/prepare-mono.sh --input FILE_OR_DIR [...] --destdir DIR [--vocab-size 32000] [--valid-percent 1]
# e.g.   data-prep/prepare-mono.sh --input ../shared/data/mono/en --destdir data-bin/mono_en --vocab-size 8000
# DIR/spm.model and DIR/dict.txt are what data-prep/prepare-glue.sh and data-prep/prepare-squad.sh take.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m fairseq_pe.data_prep.mono "$@"
