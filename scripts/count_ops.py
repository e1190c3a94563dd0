#!/usr/bin/env python3
"""Deprecated: ``fairseq-pe-count-ops`` runs what this script ran
(:mod:`fairseq_pe.benchmark.count_ops`); this path runs it with the same arguments for one more release."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fairseq_pe.benchmark.count_ops import main  # noqa: E402

if __name__ == "__main__":
    print("scripts/count_ops.py is deprecated: run fairseq-pe-count-ops (the same options); "
          "this path goes in the next release", file=sys.stderr)
    sys.exit(main())
