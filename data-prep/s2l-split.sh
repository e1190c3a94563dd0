#!/usr/bin/env bash
# The short-to-long (S2L) split of FLOATER §4.3: train on pairs whose source has < 80 tokens, test
# on every pair with >= 80, in bins [80,100), [100,120), [120,140), [140,inf).  Thin wrapper around
# fairseq_pe/translation/s2l.py (installed as `fairseq-pe-s2l-split`); see `--help` for every option.
#
# Usage: data-prep/s2l-split.sh --corpus PREFIX [PREFIX ...] | --corpus-dir DIR  -s SRC -t TGT --out DIR
#            [--spm-model M | --spm-vocab-size 8000] [--unit subword|word] [--threshold 80]
#            [--bins 80,100,120,140+] [--valid-size 1000] [--short-test-size 0] [--binarize]
# e.g. (WMT14 En-De, after data-prep/prepare-wmt14.sh --pair en-de --workdir wmt14_en_de):
#        data-prep/s2l-split.sh --corpus wmt14_en_de/raw/train -s en -t de --out wmt14_en_de_s2l \
#            --spm-model wmt14_en_de/spm/spm.model --binarize --workers 8
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m fairseq_pe.translation.s2l "$@"
