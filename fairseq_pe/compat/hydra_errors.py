"""Fix 12: in ``fairseq-hydra-train`` a user error is one line and exit status 2, as in ``fairseq-train``.

Hydra runs fairseq's ``main`` inside its own handler, which prints any exception with its traceback and exits 1, so
the plugin's excepthook (:mod:`fairseq_pe.errors`) never sees a :class:`~fairseq_pe.errors.UserError` there.  The
plugin is imported inside that ``main`` (``common.user_dir``), so what runs after it is wrapped: the training loop
(``fairseq_cli.train.train``, validation and its size checks included) and the checkpoint restore
(:mod:`fairseq_pe.compat.checkpoint_loading`'s wrapper); the model is built through
:func:`fairseq_pe.models.position_config.config_door`.  Each ends a user error with
:func:`fairseq_pe.errors.hydra_user_errors`: ``fairseq-hydra-train: error: MESSAGE`` and ``SystemExit(2)``, which
Hydra's handler lets through.  In every other process the wrapper changes nothing.

Extension point: none; ``fairseq_cli.train.train`` is a plain function (a wrapper, once).
"""

import functools
import sys

from fairseq_pe.compat.patching import fairseq_matches, patch

#: the fairseq releases this fix is written for
FIXES_FAIRSEQ = ("0.12.",)
#: it changes stock fairseq's behaviour for every task of the process (docs/install.md lists it)
CHANGES_STOCK = True
SUMMARY = "fairseq-hydra-train: a user error is one line and exit status 2, not Hydra's traceback"


def _one_line_under_hydra(train):
    @functools.wraps(train)
    def wrapper(*args, **kwargs):
        from fairseq_pe.errors import hydra_user_errors

        with hydra_user_errors():
            return train(*args, **kwargs)

    wrapper._fairseq_pe_patched = True
    return wrapper


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "hydra_errors",
                           "a user error in fairseq-hydra-train is Hydra's traceback"):
        return False
    train_cli = sys.modules.get("fairseq_cli.train")
    if train_cli is not None:  # imported by fairseq-train and fairseq-hydra-train, before the plugin
        patch(train_cli, "train", _one_line_under_hydra)
    return True
