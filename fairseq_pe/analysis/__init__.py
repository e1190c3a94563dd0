"""Analysis of position encodings (Wang et al. 2021 §2-§5): proximity matrices, the three
properties, identical-word probing and the position regression probe.  Work in progress (issue 7)."""
