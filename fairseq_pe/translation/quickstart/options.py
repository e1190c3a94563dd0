"""The options of ``fairseq-pe-quickstart``: its ``--systems``, ``--decode-variant`` and ``--extra-test`` values,
and the checks of everything the user gave before anything is written."""

import argparse
import ast
from typing import Dict, List, Tuple

from fairseq_pe import systems as catalogue
from fairseq_pe.errors import UserError
from fairseq_pe.translation.bleu import bucket_label, parse_buckets
from fairseq_pe.translation.quickstart.common import NAMED_SYSTEMS, log
from fairseq_pe.translation.quickstart.prepare import check_data, check_extra_tests
from fairseq_pe.translation.quickstart.workdir import check_inputs_outside_outputs


def parse_system(spec: str) -> (str, List[str]):
    """``NAME`` (a default system) or ``NAME=FLAGS`` (e.g. ``learned-all=--pe-absolute learned --pe-all-blocks``)."""
    if "=" in spec:
        name, flags = spec.split("=", 1)
        return name.strip(), flags.split()
    if spec in catalogue.ALIASES:
        name = catalogue.ALIASES[spec]
        log(f"--systems {spec}: the catalogue calls it {name} (same flags); its results go under that name")
        return name, NAMED_SYSTEMS[name]
    if spec not in NAMED_SYSTEMS:
        raise UserError(f"--systems: unknown system {spec!r}; use one of {sorted(NAMED_SYSTEMS)} or NAME=FLAGS")
    return spec, NAMED_SYSTEMS[spec]



def parse_decode_variant(spec: str) -> Tuple[str, str, dict]:
    """``NAME=BASE:OVERRIDES``: system BASE's checkpoints decoded with fairseq's ``--model-overrides``."""
    name, eq, rest = spec.partition("=")
    base, colon, literal = rest.partition(":")
    if not (eq and colon and name and base):
        raise argparse.ArgumentTypeError(f"--decode-variant {spec!r}: use NAME=BASE:OVERRIDES, e.g. "
                                         "\"rope-ntk=rope:{'pe_rope_scaling': 'ntk', 'pe_rope_scaling_factor': 4}\"")
    try:
        overrides = ast.literal_eval(literal)
    except (ValueError, SyntaxError):
        overrides = None
    if not isinstance(overrides, dict) or not overrides:
        raise argparse.ArgumentTypeError(f"--decode-variant {spec!r}: OVERRIDES must be a non-empty Python dict, "
                                         "as fairseq-generate's --model-overrides")
    return name, base, overrides



def parse_extra_test(spec: str) -> (str, str, str):
    """``NAME=SRC,REF``: an additional test corpus (raw text, line-aligned)."""
    name, sep, files = spec.partition("=")
    paths = files.split(",")
    if not sep or not name or len(paths) != 2 or not all(paths):
        raise argparse.ArgumentTypeError(f"--extra-test {spec!r}: use NAME=SOURCE_FILE,REFERENCE_FILE")
    return name, paths[0], paths[1]



def check_options(args) -> Tuple[List[Tuple[str, List[str]]], Dict[str, tuple]]:
    """Every option checked (and ``--buckets`` defaulted) before anything is written; returns the systems
    ``[(name, flags)]``, the ``--decode-variant`` rows last, and the variants ``{name: (base, overrides)}``."""
    if args.buckets is None:
        args.buckets = parse_buckets("1,20,40,60,80+" if args.data else "1,17,25,33,49")
    systems = [parse_system(s) for s in args.systems]
    if len(set(args.seeds)) != len(args.seeds):
        raise UserError(f"--seeds {' '.join(map(str, args.seeds))}: each seed once")
    if args.bootstrap < 0:
        raise UserError(f"--bootstrap {args.bootstrap}: give a number of resamples (0 for none; 1000 is usual)")
    if len({n for n, _ in systems}) != len(systems):
        raise UserError("--systems: names must be unique")
    variants = decode_variants(args, systems)
    for name, _ in systems:
        if not name or "/" in name or name.startswith("."):
            raise UserError(f"--systems: {name!r} cannot be a folder name")
    if args.length_unit == "subword" and not args.data:
        raise UserError("--length-unit subword needs --data (the synthetic task has no sentencepiece model)")
    if args.spm_model and not args.data:
        raise UserError("--spm-model needs --data (the synthetic task is not segmented)")
    extra_names = check_extra_test_names(args)
    if args.data:
        check_data(args)
    check_extra_tests(args)
    check_inputs_outside_outputs(args, extra_names)
    return systems, variants


def decode_variants(args, systems: List[Tuple[str, List[str]]]) -> Dict[str, tuple]:
    """Each ``--decode-variant`` checked against the trained ``systems``, to which its row is added (its flags:
    how to reproduce it with fairseq's CLIs)."""
    trained_systems = dict(systems)
    variants = {}
    for name, base, overrides in args.decode_variant:
        if base not in trained_systems:
            raise UserError(f"--decode-variant {name}={base}:...: {base} is not one of --systems "
                            f"({' '.join(trained_systems)}); add it there")
        if name in trained_systems or name in variants:
            raise UserError(f"--decode-variant {name}: the name is taken; choose another")
        variants[name] = (base, overrides)
        systems.append((name, trained_systems[base] + ["--model-overrides", repr(overrides)]))
    return variants


def check_extra_test_names(args) -> List[str]:
    """The ``--extra-test`` names: unique, not a bucket's, usable as file names."""
    extra_names = [name for name, _, _ in args.extra_test]
    bucket_names = {bucket_label(b) for b in args.buckets} | {"all", "signature"}
    if len(set(extra_names)) != len(extra_names) or bucket_names & set(extra_names):
        raise UserError(f"--extra-test: names must be unique and differ from {sorted(bucket_names)}")
    for name in extra_names:
        if "/" in name or name.startswith("."):
            raise UserError(f"--extra-test {name}: the name cannot be a file name")
    return extra_names
