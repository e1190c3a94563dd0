#!/usr/bin/env python3
"""Convert a fairseq transformer (or transformer_pe) checkpoint into a FLOATER checkpoint
whose outputs equal the original's; see ``fairseq_pe/warm_start/floater.py`` or ``--help``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fairseq_pe.warm_start.floater import cli_main  # noqa: E402

if __name__ == "__main__":
    cli_main()
