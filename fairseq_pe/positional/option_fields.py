"""The ``--pe-*`` flags from typed dataclass fields, by fairseq's own generator (issue 56).

Each family of position options is a :class:`~fairseq.dataclass.FairseqDataclass` (its fields' types, choices and
help); fairseq's ``gen_parser_from_dataclass`` makes the argparse flags of ``fairseq-train`` from it, and the Hydra
door (``fairseq-hydra-train``) checks a YAML model config against the same fields
(:mod:`fairseq_pe.models.position_config`).  fairseq's generator leaves out four things argparse had here, which a
field's metadata adds back after it ran: ``metavar``; ``argparse_type``, a parse function for a value that is not
one type (``--pe-sandwich-dim``: an even number, 'head' or 'model'); ``choices`` of integers (fairseq's
``ChoiceEnum`` holds strings); and ``negatable``, the ``--no-`` form of a tri-state switch (argparse's
``BooleanOptionalAction``: unset, so the model's default, on or off).

The families' own dataclasses (FLOATER's, the sinusoids' scales) are plain ones, importing nothing of fairseq: they
are composed into one ``FairseqDataclass`` (:class:`~fairseq_pe.models.position_config.PositionEncodingConfig`), from
which the flags are made.  Defaults are not the fields': every field defaults to None (or False), so that a model's architecture fills in its
own and an option given for an encoding that is not chosen is refused (:mod:`fairseq_pe.models.options`).
"""

import dataclasses
import enum


def choices(values) -> type:
    """The type of a field whose value is one of ``values``: an ``Enum`` of them (fairseq's generator makes its
    ``choices`` from the values, as from its own ``ChoiceEnum``), made without importing fairseq, so that the
    families' modules keep loading before it."""
    return enum.Enum("Choices", {value: value for value in values})


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_dataclass_args(group, config_class):
    """Add the fields of ``config_class`` (a dataclass) to the argparse ``group`` as flags without defaults (fairseq's generator, then each field's metadata: module docstring)."""
    from fairseq.dataclass import FairseqDataclass
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    if not issubclass(config_class, FairseqDataclass):  # a family's plain dataclass: fairseq's methods added
        config_class = dataclasses.dataclass(type(config_class.__name__, (config_class, FairseqDataclass), {}))
    gen_parser_from_dataclass(group, config_class(), delete_default=True)
    actions = {action.dest: action for action in group._group_actions}
    for field in dataclasses.fields(config_class):
        meta, action = field.metadata, actions.get(field.name)
        if action is None:
            continue
        if "metavar" in meta:
            action.metavar = meta["metavar"]
        if "argparse_type" in meta:
            action.type = meta["argparse_type"]
        if "choices" in meta:
            action.choices = list(meta["choices"])
        if meta.get("negatable"):
            group.add_argument("--no-" + flag(field.name)[2:], dest=field.name, action="store_false",
                               help=f"the opposite of {flag(field.name)}")
