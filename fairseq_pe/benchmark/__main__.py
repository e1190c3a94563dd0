"""``python -m fairseq_pe.benchmark``: ``fairseq-pe-benchmark``."""

import sys

from fairseq_pe.benchmark.cli import main

sys.exit(main())
