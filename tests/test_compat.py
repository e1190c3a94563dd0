"""The fairseq traps fixed by fairseq_pe.compat: one module per fix, each with a test of the stock failure.

Each ``test_without_*`` runs the scenario with the fix taken out (``patching.without``: fairseq's own functions
back, the fix's hooks removed) and asserts what stock fairseq does, then with the fix and asserts the repair; the
same scenarios through the CLIs are in test_resume.py (exact_resume), test_kerple.py (constrained_parameters),
test_ddp_half_precision.py (legacy_ddp_dtypes, distributed_cpu), test_half_precision.py (bf16_without_tpu),
test_user_errors.py (size_errors, checkpoint_loading)."""

import argparse
import contextlib

import numpy as np
import pytest
import torch

import fairseq_pe  # noqa: F401  (applies the fixes)
from fairseq import checkpoint_utils
from fairseq.data import data_utils

from fairseq_pe import compat
from fairseq_pe.compat import batch_by_size
from fairseq_pe.compat.patching import without


@pytest.mark.parametrize("multiple", [1, 8])
@pytest.mark.parametrize("n", [1, 13, 64, 101])
def test_batch_by_size_never_drops_a_sentence(n, multiple):
    rng = np.random.RandomState(n)
    sizes = rng.randint(1, 40, size=n)
    indices = np.argsort(sizes, kind="mergesort")
    batches = data_utils.batch_by_size(indices, lambda i: int(sizes[i]), max_tokens=120,
                                       required_batch_size_multiple=multiple)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(n))  # every sentence exactly once
    for b in batches:
        assert sizes[b].max() * len(b) <= 120 or len(b) <= multiple


def test_without_batch_by_size_the_last_sentences_are_dropped():
    """issue 40: stock 0.12 drops the last 5 of 21 sentences with --required-batch-size-multiple 8."""
    def batched():
        return data_utils.batch_by_size(np.arange(21), lambda i: 5, max_tokens=1000, required_batch_size_multiple=8)

    with without("batch_by_size"):
        assert sum(len(b) for b in batched()) == 16
    assert sorted(np.concatenate(batched()).tolist()) == list(range(21))


def test_every_fix_has_a_version_guard_and_is_named_once_in_one_log_line(caplog):
    import logging

    for module in compat.FIXES:
        assert module.FIXES_FAIRSEQ == ("0.12.",) and callable(module.apply) and module.SUMMARY
    assert compat.applied == [compat.fix_name(m) for m in compat.FIXES]
    assert {compat.fix_name(m) for m in compat.FIXES if m.CHANGES_STOCK} == {
        "checkpoint_loading", "literal_options", "archive_extraction", "batch_by_size", "size_errors", "distributed_cpu", "bf16_without_tpu",
        "exact_resume", "numpy2_eos_blocks", "hydra_errors", "run_checks"}
    with caplog.at_level(logging.INFO, logger="fairseq_pe"):
        compat.apply()  # applied once per process: nothing again, no second line
    assert not caplog.records


def test_a_fix_for_another_fairseq_release_is_not_applied_with_one_warning(monkeypatch, caplog):
    import logging

    import fairseq

    from fairseq_pe.compat import patching

    monkeypatch.setattr(fairseq, "__version__", "0.13.0")
    monkeypatch.setattr(patching, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="fairseq_pe"), without("batch_by_size"):
        stock = data_utils.batch_by_size
        for _ in range(2):
            assert not batch_by_size.apply()
        assert data_utils.batch_by_size is stock  # not wrapped again
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "fairseq 0.13.0" in warnings[0] and "'batch_by_size'" in warnings[0]


def test_without_size_errors_a_too_long_sentence_is_a_bare_exception():
    from fairseq.tasks import FairseqTask

    from fairseq_pe.errors import UserError
    from fairseq_pe.positional.injector import PositionLimit

    class Dataset:
        def filter_indices_by_size(self, indices, max_positions):
            return indices[:2], indices[2:]

        def size(self, index):
            return 40

    limit = (PositionLimit(12, "--max-source-positions (a learned table of 12 rows)"), 1024)
    with without("size_errors"), pytest.raises(Exception, match="Size of sample") as stock:
        FairseqTask.filter_indices_by_size(None, np.arange(3), Dataset(), limit)
    assert type(stock.value) is Exception
    with pytest.raises(UserError, match="The model's limit, 12, is --max-source-positions"):
        FairseqTask.filter_indices_by_size(None, np.arange(3), Dataset(), limit)


def test_without_distributed_cpu_torchrun_on_the_cpu_trains_one_model_per_process(monkeypatch):
    from fairseq.distributed import utils as distributed_utils

    def config():  # fairseq's DistributedTrainingConfig, with the defaults of fairseq-train --cpu
        return argparse.Namespace(distributed_init_method=None, tpu=False, pipeline_model_parallel=False,
                                  distributed_world_size=1, distributed_rank=0, distributed_no_spawn=False,
                                  distributed_port=-1, device_id=0)

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "WORLD_SIZE": "2", "RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with without("distributed_cpu"):
        cfg = config()
        distributed_utils.infer_init_method(cfg)
        assert cfg.distributed_world_size == 1 and cfg.distributed_init_method is None  # each process alone
    cfg = config()
    distributed_utils.infer_init_method(cfg)
    assert (cfg.distributed_init_method, cfg.distributed_world_size, cfg.distributed_rank) == ("env://", 2, 1)


@pytest.fixture
def one_process_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_without_distributed_cpu_fairseqs_ddp_wrapper_refuses_a_cpu_model(one_process_group):
    from fairseq import models

    args = argparse.Namespace(tpu=False, ddp_backend="c10d", device_id=0, broadcast_buffers=False, bucket_cap_mb=25,
                              find_unused_parameters=False, gradient_as_bucket_view=False, ddp_comm_hook="none")
    with without("distributed_cpu"), pytest.raises(ValueError, match="device_ids"):
        models.DistributedFairseqModel(args, torch.nn.Linear(2, 2), one_process_group, torch.device("cpu"))
    wrapped = models.DistributedFairseqModel(args, torch.nn.Linear(2, 2), one_process_group, torch.device("cpu"))
    assert wrapped.device_ids is None


def test_without_legacy_ddp_dtypes_float32_gradients_go_through_bf16(one_process_group):
    from fairseq.distributed import LegacyDistributedDataParallel

    module = torch.nn.Module()
    module.weights = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    module.position = torch.nn.Parameter(torch.zeros(3))  # a float32 position parameter of a bf16 model
    exact = torch.tensor([1 + 2 ** -12, 3.0, -1e-3])  # the first is not a bfloat16
    for fixed in (False, True):
        ddp = LegacyDistributedDataParallel(module, one_process_group)
        module.weights.grad, module.position.grad = torch.ones(3, dtype=torch.bfloat16), exact.clone()
        if fixed:
            ddp.all_reduce_grads()
            assert torch.equal(module.position.grad, exact)
        else:
            with without("legacy_ddp_dtypes"):
                ddp.all_reduce_grads()
            assert not torch.equal(module.position.grad, exact)  # rounded to bfloat16 on its way


def test_without_constrained_parameters_kerples_r_leaves_its_range():
    from helpers import build_model, fairseq_optimizer

    from fairseq_pe.positional.kerple import EPS

    ends = {}
    for fixed in (False, True):
        model, _ = build_model("--pe-absolute", "none", "--pe-relative", "kerple-power")
        enc = model.encoder.embed_positions.relative
        optimizer = fairseq_optimizer([p for p in model.parameters() if p.requires_grad], "fp32")
        with torch.no_grad():
            enc.r1.fill_(EPS)
        with contextlib.nullcontext() if fixed else without("constrained_parameters"):
            for _ in range(2):
                optimizer.zero_grad()
                optimizer.backward(-enc.position_bias(3, 3, 0, 1).sum())  # pushes r1 below its bound
                optimizer.step()
        ends[fixed] = enc.r1.detach().min().item()
    assert ends[False] < EPS and ends[True] == torch.tensor(EPS).item()


def test_without_exact_resume_a_bf16_training_resumes_elsewhere(tmp_path):
    from test_resume import ENCODINGS, assert_resumes_exactly

    from helpers import PRECISION_FLAGS
    from training import dictionary_dir

    flags = ENCODINGS["kerple-power"] + PRECISION_FLAGS["bf16"]
    with without("exact_resume"), pytest.raises(AssertionError, match="max"):
        assert_resumes_exactly(dictionary_dir(tmp_path / "stock"), flags, tmp_path / "stock")
    assert_resumes_exactly(dictionary_dir(tmp_path / "fixed"), flags, tmp_path / "fixed")


def test_without_bf16_without_tpu_bf16_asks_for_a_tpu():
    from fairseq import options

    def parsed():
        return options.parse_args_and_arch(options.get_training_parser(),
                                           ["data", "--arch", "transformer_pe_tiny", "--bf16", "--cpu"])

    with without("bf16_without_tpu"):
        assert parsed().tpu
    assert not parsed().tpu and parsed().bf16


def test_fairseq_checkpoint_loader_accepts_argparse_namespace(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"args": argparse.Namespace(arch="transformer_pe_tiny"), "model": {"w": torch.ones(2)},
                "cfg": None, "extra_state": {},
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                       "lr_scheduler_state": {"best": None}, "num_updates": 0}]}, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert torch.equal(state["model"]["w"], torch.ones(2))
    # fairseq's loader allows argparse.Namespace only while it loads (weights_only=True with fairseq_pe.safe_load's
    # allowlist, tests/test_safe_load.py): torch's own default is untouched
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 6):
        with pytest.raises(Exception, match="Unsupported global: GLOBAL argparse.Namespace"):
            torch.load(path)
        with pytest.raises(Exception, match="Unsupported global: GLOBAL argparse.Namespace"):
            checkpoint_utils.load_checkpoint_to_cpu.__wrapped__(str(path))  # stock fairseq on this torch


def test_break_mode_eos_blocks_are_the_sentences_on_numpy_2():
    """issue 42: fairseq's break mode eos used np.compat.long (gone in numpy 2): language-model generation stopped."""
    from fairseq.data import TokenBlockDataset

    sizes = np.array([3, 5, 2])
    stock = TokenBlockDataset._build_slice_indices.__wrapped__
    if not hasattr(np, "compat"):
        with pytest.raises(AttributeError, match="compat"):
            stock(sizes, "eos", 1, None)
    block_sizes, to_dataset, slices = TokenBlockDataset._build_slice_indices(sizes, "eos", 1, None)
    assert block_sizes.tolist() == [3, 5, 2]
    assert to_dataset.tolist() == [[0, 0, 0], [1, 0, 1], [2, 0, 2]] and to_dataset.dtype == np.int64
    assert slices.tolist() == [[0, 3], [3, 8], [8, 10]]
    none_mode = TokenBlockDataset._build_slice_indices(sizes, "none", 1, 4)
    assert [a.tolist() for a in none_mode] == [a.tolist() for a in stock(sizes, "none", 1, 4)]
