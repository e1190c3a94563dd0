"""Corpus preparation (WMT14 download, cleaning, sentencepiece, binarisation)."""
