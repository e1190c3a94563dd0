"""``python -m fairseq_pe.translation.quickstart``: ``fairseq-pe-quickstart``."""

from fairseq_pe.translation.quickstart import main

main()
