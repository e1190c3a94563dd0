"""``python -m fairseq_pe.benchmark.gpu_check``: ``fairseq-pe-gpu-check``."""

import sys

from fairseq_pe.benchmark.gpu_check.cli import main

sys.exit(main())
