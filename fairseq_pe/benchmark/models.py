"""The models compared: stock fairseq's and the plugin's of the same size, for translation (``SIZES``) and for
language models (``LM_SIZES``), the model flags every system gets, and the code with which a child process builds
one.

The baseline, ``stock``, is fairseq's own model without the plugin (no ``--user-dir``, ``fairseq_pe`` never
imported); every other system is the plugin's architecture of the same size with one position encoding, the
catalogue's group ``benchmark`` (``python -m fairseq_pe.systems names benchmark``).  ``--arch`` (plugin) and
``--stock-arch``/``--stock-flags`` (stock) override the ``--size`` preset; the two models must come out with the same
sizes (layers, dimensions, heads: :func:`check_same_size`), which is checked before anything runs.
"""

import argparse

from fairseq_pe import systems as catalogue  # (the encodings and their flags)
from fairseq_pe.errors import UserError

STOCK = "stock"

#: plugin systems: name -> fairseq-train flags (on top of --arch), the catalogue's benchmark group
SYSTEMS = catalogue.group("benchmark")

#: the same size of model, stock and plugin: --size -> (stock arch, stock flags, plugin arch)
TINY_FLAGS = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64",
              "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
              "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
SIZES = {
    "wmt": ("transformer_wmt_en_de", [], "transformer_pe_wmt_en_de"),
    "iwslt": ("transformer_iwslt_de_en", [], "transformer_pe_iwslt_de_en"),
    "tiny": ("transformer", TINY_FLAGS, "transformer_pe_tiny"),  # tests and smoke runs
}

#: what must be equal for stock and plugin (after the architecture functions)
SIZE_KEYS = ["encoder_layers", "decoder_layers", "encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim",
             "decoder_ffn_embed_dim", "encoder_attention_heads", "decoder_attention_heads", "encoder_normalize_before",
             "decoder_normalize_before", "activation_fn", "share_all_embeddings", "dropout", "attention_dropout",
             "activation_dropout"]

#: model flags of every system, stock and plugin (the shared vocabulary, no dropout)
MODEL_FLAGS = ["--share-all-embeddings", "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]

#: the same size of language model, stock and plugin: --size -> (stock arch, stock flags, plugin arch)
#: (stock "transformer_lm" is post-norm, its dataclass's default; the plugin's "transformer_lm_pe" is fairseq's
#: base_lm_architecture, pre-norm, as fairseq's named LM architectures: stock gets --decoder-normalize-before; its
#: dataclass's --decoder-input-dim and --decoder-output-dim are 512 whatever the embedding dimension)
LM_TINY_FLAGS = ["--decoder-layers", "2", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "256",
                 "--decoder-attention-heads", "4", "--decoder-normalize-before", "--decoder-input-dim", "64",
                 "--decoder-output-dim", "64"]
LM_SIZES = {
    # 6 layers, 512 dims, 8 heads, FFN 2048
    "base": ("transformer_lm", ["--decoder-normalize-before"], "transformer_lm_pe"),
    "gpt2-small": ("transformer_lm_gpt2_small", [], "transformer_lm_pe_gpt2_small"),
    "tiny": ("transformer_lm", LM_TINY_FLAGS, "transformer_lm_pe_tiny"),  # tests and smoke runs
}

#: what must be equal for stock and plugin language models (after the architecture functions)
LM_SIZE_KEYS = ["decoder_layers", "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_attention_heads",
                "decoder_normalize_before", "decoder_input_dim", "decoder_output_dim", "activation_fn",
                "share_decoder_input_output_embed", "adaptive_input", "adaptive_softmax_cutoff", "dropout",
                "attention_dropout", "activation_dropout"]

#: model flags of every language model, stock and plugin (tied input and output embeddings, no dropout)
LM_MODEL_FLAGS = ["--share-decoder-input-output-embed", "--dropout", "0", "--attention-dropout", "0",
                  "--activation-dropout", "0"]

# stock fairseq's language model is registered with a dataclass, and its own architecture "transformer_lm" sets
# nothing: fairseq's CLI fills what an architecture leaves from the dataclass's defaults (an "${model.KEY}" default is
# KEY's value; another group's, None).  The same here, for a model built from an argparse namespace (in the
# children, and model_sizes)
STOCK_LM_DEFAULTS = r"""
def stock_lm_defaults(args):
    import dataclasses
    from fairseq.models.transformer_lm import TransformerLanguageModelConfig
    fields = dataclasses.fields(TransformerLanguageModelConfig)
    for f in fields:  # the declared default ("${model.KEY}" as written, not resolved against the dataclass)
        if getattr(args, f.name, None) is None:
            setattr(args, f.name, f.default if f.default is not dataclasses.MISSING else f.default_factory())
    for key in (f.name for f in fields):
        value = getattr(args, key)
        if isinstance(value, str) and value.startswith("${model.") and value.endswith("}"):
            setattr(args, key, getattr(args, value[len("${model."):-1]))
        elif isinstance(value, str) and value.startswith("${"):  # another group's: common.tpu (False), the task's
            setattr(args, key, None)  # max_target_positions (given)
"""

# the child scripts' model: stock fairseq or the plugin (kind: "stock", "plugin"; the language models: "stock-lm",
# "plugin-lm"), arch, the flags, T + 8 positions, a dictionary of vocab words, in device and dtype (the variables the
# child has parsed from its arguments)
BUILD_MODEL = r"""
import torch
from types import SimpleNamespace
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY
if kind == "plugin":
    sys.path.insert(0, repo)
    import fairseq_pe
    from fairseq_pe.models.transformer_pe import TransformerPEModel as Model
elif kind == "plugin-lm":
    sys.path.insert(0, repo)
    import fairseq_pe
    from fairseq_pe.models.transformer_lm_pe import TransformerPELanguageModel as Model
elif kind == "stock-lm":  # stock fairseq: the plugin is never imported
    from fairseq.models.transformer_lm import TransformerLanguageModel as Model
else:
    from fairseq.models.transformer import TransformerModel as Model
torch.set_num_threads(threads)
parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
Model.add_args(parser)
if kind.endswith("-lm"):  # a language model's positions are the task's option (--tokens-per-sample)
    args = parser.parse_args(flags)
    args.max_target_positions = length + 8
else:
    args = parser.parse_args(flags + ["--max-source-positions", str(length + 8), "--max-target-positions",
                                      str(length + 8)])
ARCH_CONFIG_REGISTRY[arch](args)
if kind == "stock-lm":
""" + "\n".join("    " + line for line in STOCK_LM_DEFAULTS.strip().splitlines()) + r"""
    stock_lm_defaults(args)
d = Dictionary()
for i in range(vocab):
    d.add_symbol("w%d" % i)
d.pad_to_multiple_(8)
torch.manual_seed(0)
model = Model.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
model = model.to(device=device, dtype=getattr(torch, dtype))
"""


def model_sizes(plugin, arch, flags, lm=False):
    """The sizes the architecture function gives a model (stock or plugin; a language model with ``lm``), from its
    flags."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
    from fairseq.models.transformer import TransformerModel
    from fairseq.models.transformer_lm import TransformerLanguageModel

    from fairseq_pe.models.transformer_lm_pe import TransformerPELanguageModel
    from fairseq_pe.models.transformer_pe import TransformerPEModel

    if lm:
        want = TransformerPELanguageModel if plugin else TransformerLanguageModel
    else:
        want = TransformerPEModel if plugin else TransformerModel
    flag = "--arch" if plugin else "--stock-arch"
    if arch not in ARCH_MODEL_REGISTRY:
        raise UserError(f"{flag} {arch}: no such fairseq architecture")
    if ARCH_MODEL_REGISTRY[arch] is not want:
        raise UserError(f"{flag} {arch}: an architecture of {ARCH_MODEL_REGISTRY[arch].__name__}, not of "
                        f"{'the plugin' if plugin else 'stock fairseq'}'s {want.__name__}")
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    want.add_args(parser)
    try:
        args, unknown = parser.parse_known_args(flags)
    except SystemExit:
        raise UserError(f"{'' if plugin else '--stock-flags: '}bad model flags {' '.join(flags)!r}") from None
    if unknown:
        raise UserError(f"{'--arch' if plugin else '--stock-flags'}: unknown model flags {unknown}")
    ARCH_CONFIG_REGISTRY[arch](args)
    if lm and not plugin:
        namespace = {}
        exec(STOCK_LM_DEFAULTS, namespace)
        namespace["stock_lm_defaults"](args)
    return {key: getattr(args, key, None) for key in (LM_SIZE_KEYS if lm else SIZE_KEYS)}


def check_same_size(args, model_flags, keys, lm=False):
    """Stock (``--stock-arch``, ``--stock-flags``) and plugin (``--arch``) models have the same sizes, or a
    UserError names what differs: ``(stock sizes, plugin sizes)``."""
    stock_sizes = model_sizes(False, args.stock_arch, args.stock_flags_list + model_flags, lm=lm)
    plugin_sizes = model_sizes(True, args.arch, model_flags, lm=lm)
    differ = {k: (stock_sizes[k], plugin_sizes[k]) for k in keys if stock_sizes[k] != plugin_sizes[k]}
    if differ:
        raise UserError(f"--stock-arch {args.stock_arch} (--stock-flags {args.stock_flags!r}) and --arch {args.arch} "
                        f"differ: {', '.join(f'{k} {a} vs {b}' for k, (a, b) in differ.items())}; pick a --size, "
                        "or make --stock-arch/--stock-flags match --arch")
    return stock_sizes, plugin_sizes


def model_dtype(args) -> str:
    return "float16" if args.fp16 else "bfloat16" if args.bf16 else "float32"


def precision_label(args) -> str:
    device = "CPU" if args.device == "cpu" else f"CUDA ({args.gpu_name})"
    return f"{device}, {model_dtype(args)}"
