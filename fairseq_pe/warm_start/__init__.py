"""Checkpoint conversions that keep a model's outputs: a transformer into FLOATER (floater.py), stock RoBERTa into roberta_pe (roberta.py)."""
