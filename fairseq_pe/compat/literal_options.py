"""Fix: fairseq never ``eval()``s an option string; a checkpoint whose options are not literals is refused by name.

fairseq 0.12 turns some option strings into values with Python's ``eval``: ``utils.eval_str_list``,
``eval_str_dict`` and ``eval_bool`` (``xformers_att_config``, ``adaptive_softmax_cutoff``, ``adaptive_input_cutoff``,
the pipeline's balance and devices, every list-typed dataclass option on the command line, ``--left-pad-source``
of the multilingual tasks), and its models call ``eval`` themselves (``fconv``'s ``encoder_layers``,
``decoder_layers`` and attentions, ``transformer_lm``'s ``character_filters``, wav2vec's ``conv_feature_layers``,
...: :data:`EVALUATED_FIELDS`).  A checkpoint carries its options, so a file made only of allowed types (an
``argparse.Namespace`` of strings) ran code while ``fairseq-generate``, the hub or the plugin's tools built its
model.

Two parts, both applied when the plugin is imported:

* fairseq's three helpers (and the names other fairseq modules imported them under) parse with
  :func:`literal_value` instead: Python literals, with ``+`` and ``*`` of lists and numbers, as fairseq's own
  defaults are written (``fconv``'s ``"[(512, 3)] * 20"``);
* every checkpoint that fairseq's loader or the plugin's loads (:func:`check_options`) has each of
  :data:`EVALUATED_FIELDS`, wherever it sits in ``cfg`` or ``args``, parsed the same way before any model is built;
  one that is not a literal refuses the file, naming the field (:class:`~fairseq_pe.safe_load.CheckpointRefused`).

Extension point: none; fairseq 0.12 calls ``eval`` in its helpers and models directly (wrappers of the helpers, once,
and a check in the loader).
"""

import argparse
import ast
import functools
from typing import Iterator, Tuple

from fairseq_pe.compat.patching import fairseq_matches, patch, skipped

FIXES_FAIRSEQ = ("0.12.",)
CHANGES_STOCK = True
SUMMARY = ("option strings that fairseq evaluates are parsed as literals, and a checkpoint whose evaluated options "
           "are not literals is refused naming the field")

#: the options that fairseq 0.12 evaluates (``eval``, ``eval_str_list``, ``eval_str_dict``, ``eval_bool``) while it
#: builds a model, a task, a criterion or an optimizer (found by searching fairseq for those calls)
EVALUATED_FIELDS = frozenset((
    "xformers_att_config", "encoder_xformers_att_config", "decoder_xformers_att_config",
    "adaptive_softmax_cutoff", "adaptive_input_cutoff", "character_filters",
    "encoder_layers", "decoder_layers", "encoder_attention", "decoder_attention", "self_attention", "project_input",
    "gated_attention", "downsample", "pretrained", "input_layers", "decoder_zero_init",
    "conv_feature_layers", "conv_aggregator_layers", "conv_layers", "conv_dec_config", "transformer_context",
    "transformer_dec_config", "transformer_enc_config", "transformer_sampling", "vggblock_enc_config",
    "pipeline_balance", "pipeline_devices", "pipeline_encoder_balance", "pipeline_encoder_devices",
    "pipeline_decoder_balance", "pipeline_decoder_devices", "left_pad_source", "left_pad_target",
    "adam_betas", "adamax_betas", "adafactor_eps", "lamb_betas", "wer_args", "model_overrides",
    "optimizer_overrides",
))
#: the most elements a ``*`` of a literal list may make (a list of a billion elements is no option)
MAX_ELEMENTS = 100_000


class NotALiteral(ValueError):
    """An option string that is not a literal (it would have run as code in fairseq's ``eval``)."""


def _sequence_length(value) -> int:
    return len(value) if isinstance(value, (list, tuple, str)) else 1


def _evaluate(node):
    if isinstance(node, ast.Constant) and not isinstance(node.value, bytes):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_evaluate(e) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else set(items) if isinstance(node, ast.Set) else items
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_evaluate(k): _evaluate(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _evaluate(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Mult):
            sequence, count = (left, right) if isinstance(left, (list, tuple)) else (right, left)
            if isinstance(sequence, (list, tuple)):
                if not isinstance(count, int) or isinstance(count, bool) \
                        or _sequence_length(sequence) * max(count, 0) > MAX_ELEMENTS:
                    raise NotALiteral(f"{ast.unparse(node)}: a repetition of more than {MAX_ELEMENTS:,} elements")
                return sequence * count
        if type(left) is type(right) and isinstance(left, (int, float, list, tuple)) and not isinstance(left, bool):
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(left, (int, float)):
                return left * right
    raise NotALiteral(f"{ast.unparse(node)}")


def literal_value(text: str):
    """The value of ``text``, a Python literal (numbers, strings, True/False/None, tuples, lists, sets, dicts) or
    a ``+``/``*`` of lists, tuples and numbers; :class:`NotALiteral` for anything else (a name, a call, an
    attribute, a comprehension ...)."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise NotALiteral(f"{text!r} is not a Python literal ({e.msg})") from None
    try:
        return _evaluate(tree.body)
    except NotALiteral as e:
        raise NotALiteral(f"{text!r} is not a Python literal (at {e})") from None


def _literal_first(original):
    """fairseq's ``eval_str_list`` or ``eval_str_dict`` (``original``) given a string already parsed by
    :func:`literal_value`: fairseq's own code evaluates strings only, and keeps everything else."""
    def helper(x, *args, **kwargs):
        return original(literal_value(x) if isinstance(x, str) else x, *args, **kwargs)

    return helper


def eval_bool(x, default=False):
    """fairseq's ``utils.eval_bool`` with :func:`literal_value` for its ``eval`` (written out: fairseq's gives
    ``default`` for a value that is not a string, so a parsed value cannot be handed to it)."""
    if x is None or not isinstance(x, str):
        return default
    return bool(literal_value(x))


def _items(node, prefix: str) -> Iterator[Tuple[str, object]]:
    """(dotted name, value) of every entry of a checkpoint's configuration (dicts, DictConfigs, Namespaces)."""
    if isinstance(node, argparse.Namespace):
        node = vars(node)
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(node, DictConfig):
            node = OmegaConf.to_container(node, resolve=False)
    except ImportError:  # pragma: no cover (fairseq needs omegaconf)
        pass
    if isinstance(node, dict):
        for key, value in node.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            yield name, value
            if isinstance(value, (dict, argparse.Namespace)) or type(value).__name__ == "DictConfig":
                yield from _items(value, name)


def check_options(state, what: str):
    """Refuse (:class:`~fairseq_pe.safe_load.CheckpointRefused`, naming ``what`` and the field) a loaded
    checkpoint whose options include one of :data:`EVALUATED_FIELDS` that is a string but not a literal."""
    if not isinstance(state, dict) or "literal_options" in skipped():  # skipped: stock fairseq, for comparison
        return state
    from fairseq_pe.errors import CheckpointRefused

    for root in ("cfg", "args"):
        for name, value in _items(state.get(root), root):
            if name.rpartition(".")[2] in EVALUATED_FIELDS and isinstance(value, str):
                try:
                    literal_value(value)
                except NotALiteral as e:
                    raise CheckpointRefused(
                        f"{what}: refused: its option {name} = {value!r} is not a literal, and fairseq evaluates "
                        f"it as Python code while it builds the model ({e})") from None
    return state


def _parsing_literals(replacement):
    """The wrap of :func:`~fairseq_pe.compat.patching.patch` that puts ``replacement(original)`` in place of
    fairseq's helper (``__wrapped__``: fairseq's own)."""
    def wrap(original):
        helper = replacement(original)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            return helper(*args, **kwargs)

        wrapper._fairseq_pe_patched = True
        return wrapper

    return wrap


def apply() -> bool:
    if not fairseq_matches(FIXES_FAIRSEQ, "literal_options",
                           "fairseq evaluates option strings (and those of a checkpoint) as Python code"):
        return False
    import sys

    from fairseq import utils

    helpers = {"eval_str_list": _literal_first, "eval_str_dict": _literal_first, "eval_bool": lambda _: eval_bool}
    for name, replacement in helpers.items():
        patch(utils, name, _parsing_literals(replacement))
    # the modules that imported the helpers by name before: a module imported later binds the wrappers
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("fairseq.") and module is not utils:
            for name, replacement in helpers.items():
                if getattr(module, name, None) is getattr(utils, name).__wrapped__:
                    patch(module, name, _parsing_literals(replacement))
    return True
