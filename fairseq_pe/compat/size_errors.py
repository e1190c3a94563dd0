"""Fix 3: a sentence longer than the model's or the task's limit is a one-line user error naming the option.

``FairseqTask.filter_indices_by_size`` raises a bare ``Exception("Size of sample ...")`` (``fairseq-generate``) or
skips the pairs with one line (training, ``fairseq-eval-lm``).  The refusal becomes a :class:`~fairseq_pe.errors.UserError` naming the
option that sets the limit (a :class:`~fairseq_pe.positional.injector.PositionLimit` carries it); a training that
skips pairs because of the plugin's option says how many, once; where the limit says ``refuse`` (a language model in
evaluation), skipping is refused by name.

Extension point: none; the stock tasks (``translation``, ``masked_lm``) inherit the method (a wrapper, once).
"""

import functools

from fairseq_pe.errors import UserError

from fairseq_pe.compat.patching import fairseq_matches, patch

#: the fairseq releases this fix is written for
FIXES_FAIRSEQ = ("0.12.",)
#: it changes stock fairseq's behaviour for every task of the process (docs/install.md lists it)
CHANGES_STOCK = True
SUMMARY = "filter_indices_by_size: a too long sentence is a one-line user error naming the option"


def _binding_limit(max_positions):
    """The smallest of fairseq's ``max_positions`` (an int, a tuple of ints, or a dict of them)
    when it is the model's and names the option that sets it (a
    :class:`~fairseq_pe.positional.injector.PositionLimit`, with its ``why``); else None (the task's limit binds)."""
    values = max_positions.values() if isinstance(max_positions, dict) else (
        max_positions if isinstance(max_positions, (tuple, list)) else [max_positions])
    flat = []
    for value in values:
        flat.extend(value if isinstance(value, (tuple, list)) else [value])
    flat = [v for v in flat if v is not None]
    named = [v for v in flat if getattr(v, "why", None) is not None]
    if not named:
        return None
    smallest = min(named)
    return smallest if all(smallest <= v for v in flat) else None


def _size_errors_named(filter_indices_by_size):
    """fairseq refuses a sentence longer than the model or the task allows (``fairseq-generate``), or skips it with
    one line (training): the refusal names the option that sets the limit; a training that skips pairs because of
    the plugin's option (a learned table's length, ``--pe-random-positions``) says how many, once."""
    @functools.wraps(filter_indices_by_size)
    def wrapper(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        from fairseq_pe.errors import hydra_user_errors

        with hydra_user_errors():  # fairseq-hydra-train: one line (fairseq_pe.compat.hydra_errors)
            return _filter(self, indices, dataset, max_positions, ignore_invalid_inputs)

    def _filter(self, indices, dataset, max_positions, ignore_invalid_inputs):
        limit = _binding_limit(max_positions)
        try:
            kept = filter_indices_by_size(self, indices, dataset, max_positions, ignore_invalid_inputs)
        except Exception as e:  # fairseq raises a bare Exception here
            if type(e) is not Exception or not str(e).startswith("Size of sample"):
                raise
            if limit:
                raise UserError(f"{e}. The model's limit, {int(limit)}, is {limit.why}") from e
            raise UserError(f"{e}. The limit is the smaller of the task's --max-source-positions/"
                            "--max-target-positions and the model's; raise the task's limits") from e
        dropped = len(indices) - len(kept)
        if dropped and limit and limit.refuse:
            raise UserError(f"{dropped:,} of {len(indices):,} samples are longer than the model's limit, {int(limit)} "
                            f"tokens, and would be skipped, leaving a score over part of the data: {limit.fix} (the "
                            f"limit is {limit.why})")
        if dropped and limit:
            import logging

            logging.getLogger("fairseq_pe").warning(
                f"{dropped:,} of {len(indices):,} examples are longer than the model's limit, {int(limit)} tokens, "
                f"and are skipped: the limit is {limit.why}")
        return kept

    wrapper._fairseq_pe_patched = True
    return wrapper


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "size_errors",
                           "a too long sentence stops with fairseq's traceback"):
        return False
    from fairseq.tasks import FairseqTask

    patch(FairseqTask, "filter_indices_by_size", _size_errors_named)
    return True
