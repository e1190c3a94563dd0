"""The checks: one :class:`Check` per entry of :data:`CHECKS`, run in this order, the order of their value on a GPU;
each runs per system, the systems in ``SYSTEM_ORDER`` (:mod:`~fairseq_pe.benchmark.gpu_check.context`), the order
of their value.  :func:`register` adds one."""

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from fairseq_pe.benchmark.gpu_check.context import SYSTEM_ORDER
from fairseq_pe.benchmark.gpu_check.ddp import check_ddp, ddp_systems
from fairseq_pe.benchmark.gpu_check.flex import check_flex, flex_systems
from fairseq_pe.benchmark.gpu_check.kernels import check_kernels
from fairseq_pe.benchmark.gpu_check.masked_rows import MASKED_SYSTEMS, check_masked_rows
from fairseq_pe.benchmark.gpu_check.numerics import check_forward, check_incremental, check_positions
from fairseq_pe.benchmark.gpu_check.training import check_training, training_systems


@dataclass
class Check:
    """One named check: ``run(ctx, system)`` returns its measures (a dict, JSON-ready) and raises
    :class:`CheckFailed` with its problems (any other exception is a failure too).  ``systems(ctx)`` lists the
    systems it runs for, in order (a subset of the run's).  ``estimate`` is its time per system in seconds (cuda,
    cpu), below which it is not started."""
    name: str
    what: str
    run: Callable
    systems: Callable
    estimate: Dict[str, float] = field(default_factory=lambda: {"cuda": 10.0, "cpu": 5.0})


#: the checks, in the order they run; :func:`register` adds one (e.g. a position-sensitive precision comparison)
CHECKS: List[Check] = []


def register(check: Check, before: Optional[str] = None) -> Check:
    """Add ``check`` to :data:`CHECKS` (before the check named ``before``, else last)."""
    names = [c.name for c in CHECKS]
    CHECKS.insert(names.index(before) if before in names else len(CHECKS), check)
    return check


# the checks, in order
register(Check("kernels", "each attention's SDPA arguments are docs/speed.md's and reach the kernel stated "
               "(CUDA sm_80+: flash/cuDNN without a mask or with is_causal, memory-efficient/cuDNN with a mask, "
               "memory-efficient with a mask's gradient; CPU: the fused CPU kernel, blockwise/explicit as the table)",
               check_kernels, lambda ctx: ctx.systems(SYSTEM_ORDER), {"cuda": 4.0, "cpu": 2.0}))
register(Check("masked-rows", "a query whose every key is masked gives 0 (not NaN) and finite gradients in every "
               "kernel and path of the plugin's attention", check_masked_rows,
               lambda ctx: ctx.systems(MASKED_SYSTEMS), {"cuda": 4.0, "cpu": 2.0}))
register(Check("forward", "log-probabilities in each dtype on the device within FORWARD_TOLERANCE of the CPU's "
               "float32", check_forward, lambda ctx: ctx.systems(SYSTEM_ORDER), {"cuda": 3.0, "cpu": 2.0}))
register(Check("incremental", "step-by-step decoding within INCREMENTAL_TOLERANCE of the full pass, per dtype",
               check_incremental, lambda ctx: ctx.systems(SYSTEM_ORDER), {"cuda": 6.0, "cpu": 2.0}))
register(Check("positions", "what positions change survives half precision: per-token log-probabilities and the "
               "position parameters' gradients in fp16 and bf16 against float32 within the precision diagnostics' tolerances",
               check_positions, lambda ctx: ctx.systems(SYSTEM_ORDER), {"cuda": 4.0, "cpu": 3.0}))
register(Check("ddp", "2 processes, c10d and legacy_ddp (NCCL with 2+ GPUs; gloo on 1 GPU or the CPU): both ranks, "
               "every update, finite and agreeing losses", check_ddp, ddp_systems, {"cuda": 40.0, "cpu": 25.0}))
register(Check("training", "fairseq-train with --distributed-world-size 1 in each precision: every update, finite "
               "losses, skipped updates at most stock's + 2", check_training, training_systems,
               {"cuda": 25.0, "cpu": 5.0}))
register(Check("flex", "FlexAttention with the bias in its kernel and a block mask against the dense SDPA path: "
               "outputs, q/k/v and parameter gradients, peak memory and time (CUDA: T=4096, fp16); CPU: the eager "
               "forward", check_flex, flex_systems, {"cuda": 60.0, "cpu": 15.0}))
