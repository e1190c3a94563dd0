"""A stopped training resumes where it stopped (issue 39, 5).

fairseq seeds every update (``--seed`` + the number of updates), so a training stopped after K updates and resumed
from its checkpoint must end with the parameters of an uninterrupted one: exactly (max |Δθ| = 0) in float32 and,
since the checkpoint now keeps what the optimizers update (:mod:`fairseq_pe.compat`, fix 9), exactly in half
precision too: ``--fp16``'s flat float32 master buffer, ``--bf16``'s per-parameter masters, and the dynamic loss
scaler's counters.  ``--memory-efficient-fp16``/``-bf16`` have no masters: their half-precision parameters are the
weights (saved as they are) and fairseq keeps their float32 moments from torch's cast on load, so "exact" there
means the same half-precision parameters, optimizer moments and loss scale; the parameters already were, the loss
scale was not (the scaler's counters were lost).

Before the fix (the issue's runs, 12 updates against 5 + 7 resumed): FLOATER at every block with
``--pe-floater-refresh-updates 3`` ended 6.7e-3 apart in float32 (the resumed run solved again in the middle of a
refresh period: the reused solution was not in the checkpoint), KERPLE-power under ``--bf16`` 7.8e-3 apart (the
float32 masters were rebuilt from the bf16 model).  These tests, before the fix: FLOATER's refresh 9.0e-3 (every
block) and 5.5e-3 (biases) apart in float32, 3.1e-3 through fairseq-train; KERPLE-power 6.4e-3 (--fp16), 7.8e-3
(--bf16, and through fairseq-train), its --memory-efficient-fp16 parameters equal but its loss scale 32 against 64;
--amp's scale back at 8 against 16.

* Every encoding, and each that takes randomised positions with them, through fairseq's own trainer in this process
  (``Trainer.save_checkpoint`` / ``load_checkpoint``, dropout 0.1): float32, exact.
* ``--fp16`` (flat masters, on the CPU through the ``cpu_fp16_optimizer`` fixture), ``--bf16``,
  ``--memory-efficient-fp16`` and ``-bf16``, with a loss-scale window of 2 updates so that the scale grows during
  the run: exact, the loss scale included.
* ``--amp``'s GradScaler: its scale and growth tracker (a CPU scaler standing in for fairseq's CUDA one).
* Through ``fairseq-train`` (6 updates against 3, then resumed to 6 in the same ``--save-dir``, across an epoch's end):
  FLOATER at every block with ``--pe-floater-refresh-updates 2`` and ``--store-ema`` in float32, KERPLE-power under
  ``--bf16`` with ``--store-ema --ema-fp32``: the parameters and the EMA's, exact.
"""

import warnings

import pytest
import torch
from fairseq import tasks
from fairseq.optim.amp_optimizer import AMPOptimizer
from fairseq.trainer import Trainer

from helpers import ALL_ENCODINGS, PLUGIN, PRECISION_FLAGS, RANDOMISABLE, cli, synthetic_data_bin, training_config
from training import TINY, batch, build_trainer, dictionary_dir

UPDATES, STOP = 6, 3
#: FLOATER's solution reused for 2 updates: the training stops (after update 3) in the middle of a period
REFRESH = ["--pe-floater-refresh-updates", "2"]
ENCODINGS = {
    **ALL_ENCODINGS,
    **{f"{name}-random": flags + ["--pe-random-positions", "64"] for name, flags in ALL_ENCODINGS.items()
       if name in RANDOMISABLE},
    "floater-refresh": ALL_ENCODINGS["floater"] + REFRESH,
    "floater-bias-refresh": ALL_ENCODINGS["floater-bias"] + REFRESH,
}
#: source and target lengths of each update's batch (padded both sides, as fairseq batches them); the first batch
#: of each refresh period is its longest, so that FLOATER's solution serves the whole period
LENGTHS = [([12, 5], [10, 9]), ([9, 4, 7], [8, 6, 3]), ([11, 3], [12, 4]), ([6, 6, 2], [5, 7, 4]),
           ([10, 4], [7, 8]), ([8, 7, 5], [9, 2, 6])]


def differences(a: dict, b: dict):
    """{name: max |a − b|} of the floating-point tensors that differ (the same keys on both sides)."""
    assert a.keys() == b.keys()
    return {k: (a[k].double() - b[k].double()).abs().max().item() for k in a
            if torch.is_tensor(a[k]) and a[k].is_floating_point() and not torch.equal(a[k], b[k])}


def trainer_for(data, flags):
    return build_trainer(data, *TINY, *flags, "--dropout", "0.1", "--attention-dropout", "0.1",
                         "--fp16-scale-window", "2", "--fp16-init-scale", "8")


def same_configuration(trainer):
    """A new trainer, task, model and criterion of ``trainer``'s configuration (fairseq's parsing of it, the slow
    part of :func:`training.build_trainer`, done once)."""
    task = tasks.setup_task(trainer.cfg.task)
    model = task.build_model(trainer.cfg.model)
    return Trainer(trainer.cfg, task, model, task.build_criterion(trainer.cfg.criterion))


def train(trainer, until, save=None):
    """Train ``trainer`` to ``until`` updates (one batch each, fixed by the update's number); save it after."""
    dictionary = trainer.task.source_dictionary
    for update in range(trainer.get_num_updates(), until):
        assert trainer.train_step([batch(dictionary, *LENGTHS[update], seed=update)]) is not None
    assert trainer.get_num_updates() == until, "an update was skipped"
    if save is not None:
        trainer.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does first
        trainer.save_checkpoint(str(save), {"train_iterator": {"epoch": 1, "iterations_in_epoch": until,
                                                                "version": 2, "shuffle": False}})
    return trainer


def assert_resumes_exactly(data, flags, tmp_path):
    """Stopped after STOP updates (its checkpoint written: that changes nothing) and continued to UPDATES: the
    uninterrupted training; a new trainer resumed from the checkpoint to UPDATES must end where it ends."""
    straight = trainer_for(data, flags)
    flow = getattr(straight.model, "floater", None)
    train(straight, STOP, save=tmp_path / "stopped.pt")
    resumed = same_configuration(straight)
    solves = flow.num_solves if flow is not None else 0
    train(straight, UPDATES)
    if flow is not None and flow.refresh_updates > 1:  # the 4th update reused the 3rd's solution, the 5th solved
        assert flow.num_solves - solves == 1, "FLOATER's refresh is not exercised"
    resumed.load_checkpoint(str(tmp_path / "stopped.pt"))
    assert resumed.get_num_updates() == STOP
    train(resumed, UPDATES)
    apart = differences(straight.model.state_dict(), resumed.model.state_dict())
    assert not apart, f"max |Δθ| = {max(apart.values()):.3g}, first at {next(iter(apart))}"
    scalers = [getattr(t.optimizer, "scaler", None) for t in (straight, resumed)]
    if scalers[0] is not None:
        assert scalers[0].loss_scale > 8, "the loss scale did not grow: the scaler's counters go untested"
        assert scalers[1].loss_scale == scalers[0].loss_scale


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_float32_training_resumes_exactly(name, tmp_path):
    assert_resumes_exactly(dictionary_dir(tmp_path), ENCODINGS[name], tmp_path)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "memory-efficient-fp16", "memory-efficient-bf16"])
@pytest.mark.parametrize("name", ["kerple-power", "floater-bias-refresh"])
def test_half_precision_training_resumes_exactly(name, precision, tmp_path, cpu_fp16_optimizer):
    # KERPLE's r₁, r₂ stay float32 in the half-precision model and are projected into their range in the masters
    assert_resumes_exactly(dictionary_dir(tmp_path), ENCODINGS[name] + PRECISION_FLAGS[precision], tmp_path)


def test_old_half_precision_checkpoints_resume_as_before(tmp_path, cpu_fp16_optimizer):
    """A checkpoint without the masters (written before the fix) resumes with masters rebuilt from its model, as
    fairseq did."""
    stopped = train(trainer_for(dictionary_dir(tmp_path), ENCODINGS["kerple-power"] + PRECISION_FLAGS["fp16"]),
                    STOP, save=tmp_path / "stopped.pt")
    state = torch.load(tmp_path / "stopped.pt", weights_only=False)
    saved = state["last_optimizer_state"]
    assert [m.dtype for m in saved["fairseq_pe_fp32_masters"]] == [torch.float32]
    del saved["fairseq_pe_fp32_masters"], saved["fairseq_pe_loss_scaler"]
    torch.save(state, tmp_path / "old.pt")
    resumed = same_configuration(stopped)
    resumed.load_checkpoint(str(tmp_path / "old.pt"))
    (flat,) = resumed.optimizer.fp32_params.values()
    model = torch.cat([p.detach().float().reshape(-1) for p in resumed.optimizer.fp16_params])
    assert torch.equal(flat.detach(), model)


def test_amp_grad_scaler_resumes_where_it_stopped():
    """``--amp``'s GradScaler (fairseq's AMPOptimizer) keeps its scale and growth tracker across a checkpoint.  fairseq
    builds a CUDA scaler (disabled on the CPU); a CPU scaler stands in for it.  Before the fix the resumed scale was
    the initial one."""
    cfg = training_config("--amp")

    def amp_optimizer(params):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the CUDA scaler, disabled without CUDA
            optimizer = AMPOptimizer.build_optimizer(cfg, params)
        optimizer._grad_scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
        return optimizer

    weight = torch.nn.Parameter(torch.ones(3))
    stopped = amp_optimizer([weight])
    for _ in range(3):  # the scale doubles after 2 updates; the 3rd counts towards the next doubling
        stopped.backward((weight ** 2).sum())
        stopped.step()
        stopped.zero_grad()
    assert (stopped.scaler.get_scale(), stopped.scaler._get_growth_tracker()) == (16.0, 1)
    resumed = amp_optimizer([torch.nn.Parameter(weight.detach().clone())])
    resumed.load_state_dict(stopped.state_dict())
    assert (resumed.scaler.get_scale(), resumed.scaler._get_growth_tracker()) == (16.0, 1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # 160 sentences make 5 batches of 400 tokens: 6 updates cross an epoch's end, the stop after 3 does not
    return synthetic_data_bin(tmp_path_factory.mktemp("resume"), train_size=160, valid_size=8,
                              test_buckets=[(2, 9)], test_per_bucket=2, seed=11)


def fairseq_train(data, save, flags, updates):
    cli("fairseq-train", data, "--user-dir", PLUGIN, *TINY, *flags, "--optimizer", "adam", "--lr", "0.002",
        "--max-tokens", "400", "--cpu", "--num-workers", "0", "--seed", "1", "--dropout", "0.1",
        "--save-dir", str(save), "--no-epoch-checkpoints", "--disable-validation", "--log-format", "simple",
        "--max-update", str(updates))
    return torch.load(save / "checkpoint_last.pt", weights_only=False)


#: the trainings through fairseq-train: FLOATER's refresh in float32, KERPLE's bf16 masters, both with EMA
CLI_CASES = {
    "floater-refresh-ema": ENCODINGS["floater-refresh"] + ["--store-ema", "--ema-decay", "0.9"],
    "kerple-power-bf16-ema": ENCODINGS["kerple-power"] + ["--bf16", "--store-ema", "--ema-decay", "0.9", "--ema-fp32"],
}


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_fairseq_train_resumes_exactly(name, data, tmp_path):
    flags = CLI_CASES[name]
    straight = fairseq_train(data, tmp_path / "straight", flags, UPDATES)
    fairseq_train(data, tmp_path / "resumed", flags, STOP)
    resumed = fairseq_train(data, tmp_path / "resumed", flags, UPDATES)
    assert straight["extra_state"]["train_iterator"]["epoch"] == 2  # the run crossed an epoch's end
    for state in (straight, resumed):
        assert state["optimizer_history"][-1]["num_updates"] == UPDATES
    apart = differences(straight["model"], resumed["model"])
    assert not apart, f"{name}: max |Δθ| = {max(apart.values()):.3g}, first at {next(iter(apart))}"
    ema = differences(straight["extra_state"]["ema"], resumed["extra_state"]["ema"])
    assert not ema, f"{name}: the EMA's max |Δθ| = {max(ema.values()):.3g}, first at {next(iter(ema))}"
    if "--ema-fp32" in flags:
        ema32 = differences(straight["extra_state"]["ema_fp32_params"], resumed["extra_state"]["ema_fp32_params"])
        assert not ema32, f"{name}: the EMA's float32 copy: {ema32}"
