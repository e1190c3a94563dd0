"""fairseq's features that work with stock ``transformer`` work with every encoding (issue 31), in process; the
end-to-end runs through fairseq's CLIs are in ``tests/test_fairseq_features_cli.py``."""

import copy
import io
import pickle

import pytest
import torch

from fairseq_pe import systems as catalogue
from helpers import ALL_ENCODINGS, build_model, random_tokens

ENCODINGS = {**ALL_ENCODINGS, "rope-random-64": ALL_ENCODINGS["rope"] + ["--pe-random-positions", "64"],
             "t5-untied": ALL_ENCODINGS["t5"] + ["--pe-relative-untie-layers"],
             "ape-learned-all-blocks": ["--pe-absolute", "learned", "--pe-all-blocks"]}


def log_probs(model, d, seed=0):
    src = random_tokens(d, 2, 9, seed=seed, left_pad=(0, 3))
    prev = random_tokens(d, 2, 7, seed=seed + 1)
    out = model(src, torch.tensor([9, 6]), prev)
    return model.get_normalized_probs(out, log_probs=True)


# ---- 2. a copy of the model after a pass (fairseq's EMA deep-copies it after the first update) -----------------


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_a_model_is_copied_pickled_and_saved_after_a_training_pass(name):
    model, d = build_model(*ENCODINGS[name], "--dropout", "0")
    model.train()
    log_probs(model, d).float().sum().backward()  # the pass's tensors (FLOATER's biases with their graph) remain
    twin = copy.deepcopy(model)
    again = pickle.loads(pickle.dumps(model))
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    assert all(not t.requires_grad or t.is_leaf for t in model.state_dict().values())
    model.eval(), twin.eval(), again.eval()
    with torch.no_grad():
        expected = log_probs(model, d, seed=5)
        torch.testing.assert_close(log_probs(twin, d, seed=5), expected)
        torch.testing.assert_close(log_probs(again, d, seed=5), expected)


# ---- 1. LayerDrop pruning at generation ---------------------------------------------------------------------------

#: encodings with position parameters (or vectors) per layer, and two without
PER_LAYER = {
    "ape-learned-all-blocks": ["--pe-absolute", "learned", "--pe-all-blocks"],
    "ape-sinusoidal-all-blocks": ["--pe-absolute", "sinusoidal", "--pe-all-blocks"],  # P(i) + P(n): n matters
    "rpe-learned-untied": ["--pe-absolute", "none", "--pe-relative", "learned", "--pe-relative-untie-layers"],
    "t5-untied": ALL_ENCODINGS["t5"] + ["--pe-relative-untie-layers"],
    "fire-untied": ALL_ENCODINGS["fire"] + ["--pe-relative-untie-layers"],
    "kerple-power": ALL_ENCODINGS["kerple-power"],
    "floater": ALL_ENCODINGS["floater"],
    "floater-bias": ALL_ENCODINGS["floater-bias"],
    "rope": ALL_ENCODINGS["rope"],
    "none": ALL_ENCODINGS["none"],
}
LAYERS = ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-layerdrop", "0.2", "--decoder-layerdrop", "0.2"]


@pytest.mark.parametrize("name", list(PER_LAYER))
def test_layerdrop_pruning_keeps_each_layers_own_positions(name):
    """A model trained with LayerDrop, loaded with encoder layers 0 and 2 and decoder layer 1 kept (fairseq renumbers
    the ``.layers.N.`` keys; the plugin's per-block tensors keep their size and each kept layer its block): the
    pruned model computes what the full model computes with the other layers dropped."""
    full, d = build_model(*PER_LAYER[name], *LAYERS, "--dropout", "0")
    keep = {"encoder_layers_to_keep": "0,2", "decoder_layers_to_keep": "1", "arch": "transformer_pe_tiny"}  # as loaded
    pruned, _ = build_model(*PER_LAYER[name], *LAYERS, "--dropout", "0", seed=7, overrides=keep)
    assert len(pruned.encoder.layers) == 2 and len(pruned.decoder.layers) == 1
    pruned.load_state_dict(full.state_dict(), model_cfg=pruned.args)  # through fairseq's prune_state_dict
    full.encoder.layers = torch.nn.ModuleList([full.encoder.layers[0], full.encoder.layers[2]])
    full.decoder.layers = torch.nn.ModuleList([full.decoder.layers[1]])
    full.encoder.num_layers, full.decoder.num_layers = 2, 1
    with torch.no_grad():
        torch.testing.assert_close(log_probs(pruned, d), log_probs(full, d), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("keep,message", [("0,3", r"each of the 3 encoder layers \(0 to 2\) at most once"),
                                          ("1,1", "at most once"), ("a", "comma-separated layer numbers")])
def test_bad_layers_to_keep_are_refused_by_name(keep, message):
    """As --model-overrides gives them (a string), on a model of 3 encoder layers."""
    from argparse import Namespace

    from fairseq_pe.errors import UserError
    from fairseq_pe.models.layers import layer_blocks

    with pytest.raises(UserError, match=f"--encoder-layers-to-keep '{keep}': .*{message}"):
        layer_blocks(Namespace(encoder_layers=3, encoder_layers_to_keep=keep), "encoder")
    assert layer_blocks(Namespace(encoder_layers=3, encoder_layers_to_keep="2,0"), "encoder") == (3, [1, 3])
    assert layer_blocks(Namespace(encoder_layers=3, encoder_layers_to_keep=[2, 0]), "encoder") == (3, [1, 3])


def test_every_layer_gets_its_block_when_built_with_layerdrop():
    """fairseq's LayerDropModuleList drops layers at random when iterated in training mode, which a model is when
    built: every layer must still be attached to its block and the side's relative encoding (some were not)."""
    for seed in range(3):
        model, _ = build_model("--pe-absolute", "learned", "--pe-all-blocks", "--pe-relative", "alibi",
                               "--encoder-layers", "6", "--encoder-layerdrop", "0.9", "--decoder-layers", "6",
                               "--decoder-layerdrop", "0.9", seed=seed)
        for side in (model.encoder, model.decoder):
            layers = [side.layers[i] for i in range(len(side.layers))]
            assert [layer.block for layer in layers] == list(range(1, 7))
            assert all(layer.self_attn.uses_relative for layer in layers)


# ---- 3. --retain-dropout --retain-dropout-modules, with stock fairseq's names -------------------------------------


def generation_cfg(*modules):
    from omegaconf import OmegaConf

    return OmegaConf.create({"generation": {"retain_dropout": True, "retain_dropout_modules": list(modules),
                                            "beam": 5, "no_beamable_mm": False, "print_alignment": False}})


def test_retain_dropout_takes_the_names_of_stock_fairseqs_modules():
    """fairseq matches --retain-dropout-modules by class name; the plugin's encoder, decoder and layers answer to
    stock's names (TransformerEncoder, TransformerDecoderLayerBase, ...), which silently matched nothing before."""
    from fairseq.modules import FairseqDropout

    model, d = build_model("--dropout", "0.3")
    model.prepare_for_inference_(generation_cfg("TransformerEncoder", "TransformerDecoderLayerBase"))
    applied = {m.module_name for m in model.modules() if isinstance(m, FairseqDropout) and m.apply_during_inference}
    assert applied == {"TransformerEncoder", "TransformerDecoderLayerBase"}
    assert model.encoder.dropout_module.apply_during_inference
    assert not model.encoder.layers[0].dropout_module.apply_during_inference
    assert all(layer.dropout_module.apply_during_inference for layer in model.decoder.layers)
    with torch.no_grad():  # the encoder's dropout acts in evaluation: two passes differ
        assert not torch.equal(log_probs(model, d), log_probs(model, d))


@pytest.mark.parametrize("names,selected", [
    (("TransformerEncoder", "TransformerEncoderLayer"), {"encoder", "encoder.layers"}),  # fairseq's own test's
    (("TransformerEncoderLayerBase",), {"encoder.layers"}),
    (("PositionAwareEncoderLayer", "TransformerDecoderLayer"), {"encoder.layers", "decoder.layers"}),
    (("TransformerPEEncoder",), {"encoder"}),
    (("MultiheadAttention",), {"encoder.layers.self_attn", "decoder.layers.self_attn", "decoder.layers.encoder_attn"}),
])
def test_retain_dropout_takes_the_class_names_of_fairseqs_layers_and_the_plugins(names, selected):
    """A name selects the dropout modules whose owner's class, or a base class of it, has that name; fairseq 0.12's
    XBase classes also answer to X, the legacy name (fairseq's tests/test_inference_dropout.py uses
    TransformerEncoderLayer, refused before: "no dropout module of this model is called 'TransformerEncoderLayer'")."""
    import re

    from fairseq.modules import FairseqDropout

    model, _ = build_model("--dropout", "0.3")
    model.prepare_for_inference_(generation_cfg(*names))
    applied = {re.sub(r"\.\d+", "", name.rpartition(".")[0]) for name, m in model.named_modules()
               if isinstance(m, FairseqDropout) and m.apply_during_inference}
    assert applied == selected


def test_a_retained_dropout_module_that_does_not_exist_is_refused():
    from fairseq_pe.errors import UserError

    model, _ = build_model("--dropout", "0.3")
    with pytest.raises(UserError, match="--retain-dropout-modules: no dropout module of this model is called "
                                        "'TransformerEncoderLayr' \\(its class or a base class\\); its dropout "
                                        "modules are MultiheadAttention, TransformerDecoder, "
                                        "TransformerDecoderLayerBase, TransformerEncoder, TransformerEncoderLayerBase"):
        model.prepare_for_inference_(generation_cfg("TransformerEncoderLayr"))


# ---- 5. TorchScript ----------------------------------------------------------------------------------------------

EXPORTABLE = {
    **{name: catalogue.flags(name) for name in ("none", "ape-learned", "ape-sinusoidal")},
    "ape-learnable-sinusoidal-scaled": ["--pe-absolute", "learnable-sinusoidal", "--pe-sinusoid-scale", "0.5"],
    "ape-sinusoidal-fairseq": catalogue.flags("ape-sinusoidal-fairseq"),
}


@pytest.mark.parametrize("name", list(EXPORTABLE))
def test_torchscript_exports_the_absolute_encodings(name):
    """torch.jit.script of the model (fairseq's scriptable transformer with these weights and positions) computes what
    the model computes, and fairseq's scripted SequenceGenerator finds the hypotheses of the Python one."""
    from fairseq.sequence_generator import SequenceGenerator

    model, d = build_model(*EXPORTABLE[name], "--dropout", "0")
    scripted = torch.jit.script(model)
    src, prev = random_tokens(d, 2, 9, left_pad=(0, 3)), random_tokens(d, 2, 6, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(scripted(src, torch.tensor([9, 6]), prev)[0], model(src, torch.tensor([9, 6]), prev)[0],
                                   rtol=1e-5, atol=1e-5)
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([9, 6])}}
    python = SequenceGenerator([model], d, beam_size=2, max_len_b=8).generate([model], sample)
    generator = torch.jit.script(SequenceGenerator([copy.deepcopy(model)], d, beam_size=2, max_len_b=8))
    exported = generator.forward(sample)
    for ours, theirs in zip(python, exported):
        assert [h["tokens"].tolist() for h in ours] == [h["tokens"].tolist() for h in theirs]


@pytest.mark.parametrize("flags,named", [
    (ALL_ENCODINGS["rope"], "--pe-relative rope"), (ALL_ENCODINGS["alibi"], "--pe-relative alibi"),
    (ALL_ENCODINGS["floater-input"], "--pe-absolute floater"), (ALL_ENCODINGS["floater-bias"], "--pe-floater-bias"),
    (["--pe-absolute", "learned", "--pe-all-blocks"], "--pe-all-blocks"),
    (["--pe-absolute", "sinusoidal", "--pe-random-positions", "64"], "--pe-random-positions 64"),
])
def test_torchscript_refuses_the_other_encodings_by_name(flags, named):
    from fairseq_pe.errors import UserError

    model, _ = build_model(*flags)
    with pytest.raises(UserError, match=f"torch.jit.script: a transformer_pe with .*{named}.* cannot be exported"):
        torch.jit.script(model)
