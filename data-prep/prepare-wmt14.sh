#!/usr/bin/env bash
# Prepare WMT14 English-German or English-French for fairseq: fetch (or --raw-dir), clean, joint
# sentencepiece, fairseq-preprocess.  Thin wrapper around fairseq_pe/data_prep/wmt14.py (installed
# as `fairseq-pe-prepare-wmt14`); every step is skipped on a re-run once done.
#
# Usage: data-prep/prepare-wmt14.sh --pair en-de|en-fr --workdir DIR [--raw-dir DIR]
#            [--spm-vocab-size 32000] [--spm-input-sentence-size 10000000] [--workers N]
#            [--max-len 250] [--ratio 1.5]
# e.g.   data-prep/prepare-wmt14.sh --pair en-de --workdir wmt14_en_de
#        data-prep/prepare-wmt14.sh --pair en-fr --workdir wmt14_en_fr --raw-dir ~/downloads/wmt14
# See `data-prep/prepare-wmt14.sh --help` for the details (sizes, cleaning rules, outputs).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python}" -m fairseq_pe.data_prep.wmt14 "$@"
