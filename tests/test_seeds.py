"""Combining scores over training seeds: mean and sample standard deviation, n/a kept n/a."""

import math

import pytest

from fairseq_pe.translation.bucket_bleu import format_table
from fairseq_pe.seeds import combine, describe, mean_sd


def test_mean_and_sample_standard_deviation_by_hand():
    assert mean_sd([2.0, 4.0, 9.0]) == (5.0, pytest.approx(math.sqrt(((2 - 5) ** 2 + 1 + 16) / 2)))
    assert mean_sd([3.0]) == (3.0, None)
    assert all(math.isnan(x) for x in mean_sd([1.0, math.nan]))


def test_combine_over_seeds():
    per_seed = {
        1: {"a": {"[1,5)": {"bleu": 10.0, "n": 3, "ratio": 1.0, "bleu_ci": 2.0}, "signature": "sig"},
            "b": {"[1,5)": {"bleu": None, "n": 3, "ratio": None, "na": "too long"}, "signature": "sig"}},
        2: {"a": {"[1,5)": {"bleu": 20.0, "n": 3, "ratio": 0.5}, "signature": "sig"},
            "b": {"[1,5)": {"bleu": 7.0, "n": 3, "ratio": 1.0}, "signature": "sig"}},
        3: {"a": {"[1,5)": {"bleu": 30.0, "n": 3, "ratio": 0.9}, "signature": "sig"},
            "b": {"[1,5)": {"bleu": 8.0, "n": 3, "ratio": 1.0}, "signature": "sig"}},
    }
    out = combine(per_seed)
    a = out["a"]["[1,5)"]
    assert a["bleu"] == 20.0 and a["bleu_sd"] == pytest.approx(10.0) and a["bleu_seeds"] == [10.0, 20.0, 30.0]
    assert a["ratio"] == pytest.approx(0.8) and a["n"] == 3 and a["seeds"] == 3
    assert "bleu_ci" not in a  # a single run's interval says nothing about the spread over seeds
    b = out["b"]["[1,5)"]
    assert b["bleu"] is None and b["na"] == "too long"  # never a mean of the seeds that could be scored
    assert out["a"]["signature"] == "sig"
    table = format_table({k: {**v, "all": v["[1,5)"]} for k, v in out.items()}, [(1, 5)], "t")
    assert "| 20.0 ± 10.0 " in table and "n/a [1]" in table and "[1] b: too long" in table
    # a single seed passes through, with its bootstrap interval
    single = combine({1: per_seed[1]})
    assert single["a"]["[1,5)"]["bleu_ci"] == 2.0
    assert "10.0 ±2.0" in format_table({"a": {**single["a"], "all": single["a"]["[1,5)"]}}, [(1, 5)], "t")
    assert "ONE training seed" in describe([1], 1000) and "3 training seeds (1, 2, 3)" in describe([1, 2, 3], 0)


def test_bert_cpu_table_combines_its_seeds():
    import importlib.util
    import os

    from helpers import REPO

    spec = importlib.util.spec_from_file_location("bert_cpu_table",
                                                  os.path.join(REPO, "scripts", "recipes", "bert_cpu_table.py"))
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    row = table.combine_seeds("ape-learned", "--pe-absolute learned", {1: {"mlm_valid_loss": 8.0, "sst2_accuracy": 80.0},
                                              2: {"mlm_valid_loss": 9.0, "sst2_accuracy": 70.0},
                                              3: {"mlm_valid_loss": 10.0}})
    assert row["flags"] == "--pe-absolute learned"
    assert row["mlm_valid_loss"] == 9.0 and row["mlm_valid_loss_sd"] == pytest.approx(1.0)
    assert row["mlm_valid_loss_seeds"] is None  # every seed has it
    # missing in seed 3: the mean of the other two, which the table names
    assert row["sst2_accuracy"] == 75.0 and row["sst2_accuracy_seeds"] == [1, 2]
    assert row["squad_f1"] is None and row["squad_f1_seeds"] is None
    assert table.fmt(row["mlm_valid_loss"], 3, row["mlm_valid_loss_sd"]) == "9.000 ± 1.000"
    assert table.fmt(row["sst2_accuracy"], 1, row["sst2_accuracy_sd"], row["sst2_accuracy_seeds"]) == \
        "75.0 ± 7.1 (seeds 1, 2)"
    assert table.fmt(9.27, 1, None, [1]) == "9.3 (seed 1)"


def test_bert_cpu_table_refuses_seeds_of_different_options(tmp_path):
    import argparse
    import importlib.util
    import os

    import torch

    from helpers import REPO

    spec = importlib.util.spec_from_file_location("bert_cpu_table",
                                                  os.path.join(REPO, "scripts", "recipes", "bert_cpu_table.py"))
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    for seed, bound in ((1, 1.0), (2, 0.02), (3, 0.02)):
        (tmp_path / f"pt-floater-s{seed}").mkdir()
        model = argparse.Namespace(arch="roberta_pe_tiny", pe_absolute="floater", pe_floater_bound=bound, lr=[1e-3])
        torch.save({"cfg": {"model": model}}, tmp_path / f"pt-floater-s{seed}" / "checkpoint_last.pt")
    configs = {seed: table.encoding_config(str(tmp_path), f"floater-s{seed}") for seed in (1, 2, 3, 4)}
    assert configs[4] is None and configs[2] == {"arch": "roberta_pe_tiny", "pe_absolute": "floater",
                                                 "pe_floater_bound": 0.02}
    assert table.check_same_config("floater", {2: configs[2], 3: configs[3], 4: None}) == configs[2]
    with pytest.raises(SystemExit, match=r"pe_floater_bound: 1\.0 in seed 1, 0\.02 in seed 2.*pt-floater-sSEED"):
        table.check_same_config("floater", configs)
