"""BERT-style evaluation: GLUE metrics and SQuAD span predictions of roberta_pe (pretraining and fine-tuning run through fairseq's own tasks)."""
