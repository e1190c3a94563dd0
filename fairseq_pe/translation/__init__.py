"""Translation: the short-to-long split, BLEU and loss per source-length bucket, the quickstart and its synthetic task."""
