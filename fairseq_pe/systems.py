"""The one catalogue of named systems: each name, its ``--pe-*`` flags and what it can do.

Every script, recipe, test and page that names a system reads it here (``tests/test_systems.py`` fails when
a list of systems is written out again elsewhere).  A name means the same flags everywhere; the spellings
used before the catalogue (:data:`ALIASES`) are accepted and name their replacement.

Importing this module imports neither torch nor fairseq (the quickstart's ``--help`` stays fast).  What the
registry of :mod:`fairseq_pe.positional.base` knows (a length limit, query terms) is read from the registered
classes on first use (:meth:`System.encoding_class`); what the options refuse (randomised positions with
FLOATER) is the static rule of :attr:`System.randomisable`, checked against ``fairseq_pe.models.options`` by
the tests.

Shell recipes read it through ``python -m fairseq_pe.systems``::

    python -m fairseq_pe.systems flags NAME        # its flags, one line
    python -m fairseq_pe.systems names GROUP       # the names of a group, one line
    python -m fairseq_pe.systems group GROUP       # a line "NAME FLAGS..." per system of a group
    python -m fairseq_pe.systems canonical NAME... # the catalogue's spelling of each NAME (an alias resolved)
    python -m fairseq_pe.systems table             # every system, its flags and capabilities
"""

import shlex
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

#: positions drawn by the randomised systems (Ruoss et al. 2023) from [0, 256): past the longest sentence of
#: the quickstart's and the captions recipe's tests (196 target tokens), 7x the captions' longest training target
RANDOM_POSITIONS = "256"
#: the encodings with trainable position parameters (the others are functions of the positions)
TRAINABLE_ABSOLUTE = ("learned", "learnable-sinusoidal", "floater")
TRAINABLE_RELATIVE = ("learned", "learnable-sinusoidal", "t5", "kerple-log", "kerple-power", "fire", "fox", "cope")
#: relative encodings that take no positions (FoX's gates, CoPE's counts come from the data): randomised positions
#: change nothing of them (``options.py`` refuses them there without an absolute encoding)
POSITIONLESS_RELATIVE = ("fox", "cope")


@dataclass(frozen=True)
class System:
    """One named system: ``flags`` (fairseq-train's ``--pe-*`` options), the paper it follows, and, for
    FLOATER's warm start (§4.4), the first stage's flags and its share of the updates."""

    name: str
    flags: Tuple[str, ...]
    source: str = ""
    warm_start: Optional[Tuple[Tuple[str, ...], float]] = None

    def _value(self, flag: str) -> str:
        return self.flags[self.flags.index(flag) + 1] if flag in self.flags else "none"

    @property
    def absolute(self) -> str:
        """``--pe-absolute`` (``none`` when unset)."""
        return self._value("--pe-absolute")

    @property
    def relative(self) -> str:
        """``--pe-relative`` (``none`` when unset)."""
        return self._value("--pe-relative")

    @property
    def floater(self) -> bool:
        return self.absolute == "floater" or "--pe-floater-bias" in self.flags

    @property
    def trainable(self) -> bool:
        """It has trainable position parameters (checked against training by tests/test_half_precision_training.py)."""
        return (self.absolute in TRAINABLE_ABSOLUTE or self.relative in TRAINABLE_RELATIVE
                or "--pe-floater-bias" in self.flags or self._value("--pe-dape") != "none")

    @property
    def randomisable(self) -> bool:
        """``--pe-random-positions`` can be added (``options.py``: not FLOATER, not without an encoding)."""
        return (not self.floater and "--pe-random-positions" not in self.flags
                and (self.absolute, self.relative) != ("none", "none")
                and not (self.absolute == "none" and self.relative in POSITIONLESS_RELATIVE))

    def encoding_class(self, kind: str):
        """The registered class of ``--pe-<kind>`` (None for ``none``); imports the registry (torch)."""
        from fairseq_pe.positional import base

        import fairseq_pe.positional  # noqa: F401  (registers the families)

        name = self.absolute if kind == "absolute" else self.relative
        return None if name == "none" else base._REGISTRY[(kind, name)]

    @property
    def has_length_limit(self) -> bool:
        """Its absolute encoding is a table of ``--max-*-positions`` rows (the registry's ``has_length_limit``)."""
        cls = self.encoding_class("absolute")
        return bool(cls is not None and cls.has_length_limit)

    @property
    def query_terms(self) -> bool:
        """Its relative encoding adds query-dependent terms (the registry's ``query_terms``: Shaw's family)."""
        cls = self.encoding_class("relative")
        return bool(cls is not None and cls.query_terms)

    @property
    def causal_only(self) -> bool:
        """Defined for causal attention only (a registered class's ``causal_only``; none is, today)."""
        return any(getattr(self.encoding_class(kind), "causal_only", False) for kind in ("absolute", "relative"))

    @property
    def encoder_capable(self) -> bool:
        return not self.causal_only


def _system(name: str, flags: str, source: str = "", warm_start=None) -> System:
    return System(name, tuple(shlex.split(flags)), source, warm_start)


_NONE = "--pe-absolute none"
#: every named system, in the order of the tables (the quickstart's defaults first)
SYSTEMS: Dict[str, System] = {s.name: s for s in [
    _system("none", _NONE, "no position information (control)"),
    _system("ape-learned", "--pe-absolute learned", "Gehring et al. 2017; BERT"),
    _system("ape-sinusoidal", "--pe-absolute sinusoidal", "Vaswani et al. 2017"),
    _system("ape-learnable-sin", "--pe-absolute learnable-sinusoidal", "Wang et al. 2021, learnable sinusoid"),
    _system("rpe-learned", f"{_NONE} --pe-relative learned", "Shaw et al. 2018"),
    _system("rpe-sinusoidal", f"{_NONE} --pe-relative sinusoidal", "Wei et al. 2019 (NEZHA)"),
    _system("rpe-learnable-sin", f"{_NONE} --pe-relative learnable-sinusoidal", "Wang et al. 2021"),
    _system("rope", f"{_NONE} --pe-relative rope", "Su et al. 2021"),
    _system("alibi", f"{_NONE} --pe-relative alibi", "Press et al. 2022"),
    _system("t5", f"{_NONE} --pe-relative t5", "Raffel et al. 2020"),
    _system("floater", "--pe-absolute floater --pe-all-blocks", "Liu et al. 2020, every block"),
    _system("floater-bias", "--pe-absolute sinusoidal --pe-floater-bias", "Liu et al. 2020, Q/K/V biases"),
    # FLOATER's own procedure (§4.4, Table 2, Fig. 2): the sinusoidal model, converted (h ≡ 0, exact) and
    # fine-tuned with the ODE biases for the rest of the updates
    _system("floater-warm", "--pe-absolute sinusoidal --pe-floater-bias", "Liu et al. 2020, warm-started",
            warm_start=(("--pe-absolute", "sinusoidal"), 0.5)),
    _system("ape-sin+rpe-learned", "--pe-absolute sinusoidal --pe-relative learned", "Shaw et al. 2018's pairing"),
    _system("kerple-log", f"{_NONE} --pe-relative kerple-log", "Chi et al. 2022"),
    _system("kerple-power", f"{_NONE} --pe-relative kerple-power", "Chi et al. 2022"),
    _system("xpos", f"{_NONE} --pe-relative xpos", "Sun et al. 2023"),
    _system("sandwich", f"{_NONE} --pe-relative sandwich", "Chi et al. 2023"),
    _system("fire", f"{_NONE} --pe-relative fire", "Li et al. 2024"),
    _system("ape-sinusoidal-random", f"--pe-absolute sinusoidal --pe-random-positions {RANDOM_POSITIONS}",
            "Ruoss et al. 2023"),
    _system("rope-random", f"{_NONE} --pe-relative rope --pe-random-positions {RANDOM_POSITIONS}", "Ruoss et al. 2023"),
    _system("sandwich-random", f"{_NONE} --pe-relative sandwich --pe-random-positions {RANDOM_POSITIONS}",
            "Ruoss et al. 2023"),
    _system("fire-random", f"{_NONE} --pe-relative fire --pe-random-positions {RANDOM_POSITIONS}", "Ruoss et al. 2023"),
    _system("floater-input", "--pe-absolute floater", "Liu et al. 2020, at the input only"),
    _system("ape-sinusoidal-fairseq", "--pe-absolute sinusoidal-fairseq", "fairseq's own sinusoids"),
    _system("ape-sinusoidal-all", "--pe-absolute sinusoidal --pe-all-blocks", "FLOATER's Table 2"),
    _system("ape-learned-all", "--pe-absolute learned --pe-all-blocks", "FLOATER's Table 2"),
    _system("ape-learnable-sin-all", "--pe-absolute learnable-sinusoidal --pe-all-blocks", ""),
    _system("ape+rpe-learnable-sin", "--pe-absolute learnable-sinusoidal --pe-relative learnable-sinusoidal",
            "Wang et al. 2021"),
    _system("ape-learned+rpe-learned", "--pe-absolute learned --pe-relative learned", "Wang et al. 2021"),
    _system("ape-learned+rpe-sinusoidal", "--pe-absolute learned --pe-relative sinusoidal", ""),
    _system("ape-learned+floater-bias", "--pe-absolute learned --pe-floater-bias",
            "Liu et al. 2020 §4.2: a pretrained RoBERTa's table kept, FLOATER's Q/K/V biases added"),
    _system("p-rope", f"{_NONE} --pe-relative p-rope --pe-rope-proportion 0.75", "Barbero et al. 2025"),
    _system("rope-resonance", f"{_NONE} --pe-relative rope --pe-rope-resonance", "Wang et al. 2024"),
    # L = 37, the captions recipe's longest training target (its YaRN original length): the training length of the
    # recipes this catalogue serves on the CPU; another corpus sets its own --pe-fope-train-length
    _system("fope", f"{_NONE} --pe-relative fope --pe-fope-train-length 37", "Hua et al. 2024"),
    _system("fox", f"{_NONE} --pe-relative fox", "Lin et al. 2025 (forgetting attention)"),
    _system("cope", f"{_NONE} --pe-relative cope", "Golovneva et al. 2024"),
    # DAPE (Zheng et al. 2024) on the biases of its paper: v1's MLP, v2's convolutions along the keys
    _system("alibi-dape", f"{_NONE} --pe-relative alibi --pe-dape v1", "Zheng et al. 2024 (DAPE)"),
    _system("kerple-log-dape", f"{_NONE} --pe-relative kerple-log --pe-dape v1", "Zheng et al. 2024 (DAPE)"),
    # DAPE's own FIRE (its reference's FIRE_DAPE / FIRE_C and released config): LeakyReLU in FIRE's MLP, L₀ = 64
    _system("fire-dape", f"{_NONE} --pe-relative fire --pe-fire-activation leaky-relu --pe-fire-threshold 64 "
                         "--pe-dape v1", "Zheng et al. 2024 (DAPE)"),
    _system("alibi-dape2", f"{_NONE} --pe-relative alibi --pe-dape v2", "Zheng et al. 2024 (DAPE v2)"),
    _system("kerple-log-dape2", f"{_NONE} --pe-relative kerple-log --pe-dape v2", "Zheng et al. 2024 (DAPE v2)"),
]}

#: spellings used before the catalogue -> the catalogue's name (same flags)
ALIASES: Dict[str, str] = {
    "ape-learnable-sinusoidal": "ape-learnable-sin", "rpe-learnable-sinusoidal": "rpe-learnable-sin",
    "ape-sin": "ape-sinusoidal", "ape-lsin": "ape-learnable-sin", "rpe-sin": "rpe-sinusoidal",
    "rpe-lsin": "rpe-learnable-sin", "ape-lsin+rpe-lsin": "ape+rpe-learnable-sin",
}

#: the rotary encodings of 2024-2025 (issue 43)
ROTARY_2024 = ("p-rope", "rope-resonance", "fope")
#: the encodings of 2024-2025 that read the logits or the layer's input (issue 43: the attention's logits hook), one
#: system each (DAPE v2 differs from v1 by its network only: tests/test_logit_hook_encodings.py, test_cli_e2e.py and
#: test_lm.py run it by name)
DATA_DEPENDENT_2024 = ("fox", "cope", "kerple-log-dape")
#: named subsets, in their tables' order: who runs them
GROUPS: Dict[str, Tuple[str, ...]] = {
    # fairseq-pe-quickstart's default --systems
    "quickstart": ("none", "ape-learned", "ape-sinusoidal", "ape-learnable-sin", "rpe-learned", "rpe-sinusoidal",
                   "rpe-learnable-sin", "rope", "alibi", "t5", "floater", "floater-bias", "floater-warm"),
    # the extrapolation encodings since 2021 and the randomised positions, beside the quickstart's
    "extrapolation": ("kerple-log", "kerple-power", "xpos", "sandwich", "fire", "ape-sinusoidal-random",
                      "rope-random"),
    # scripts/recipes/s2l-cpu-en-de.sh
    "s2l-cpu-en-de": ("floater", "rpe-learned", "rpe-sinusoidal", "rpe-learnable-sin", "ape-sin+rpe-learned",
                      "rope", "alibi", "none", "ape-learned", "ape-sinusoidal", "ape-learnable-sin"),
    # scripts/recipes/s2l-all-encodings.sh (trained from scratch; floater-ws and its control follow)
    "s2l-all-encodings": ("none", "ape-learned", "ape-sinusoidal", "ape-learnable-sin", "rpe-learned",
                          "rpe-sinusoidal", "rpe-learnable-sin", "ape+rpe-learnable-sin", "rope", "alibi", "t5",
                          "floater", "floater-bias"),
    # scripts/recipes/floater-table2.sh (trained from scratch; floater-ws and its control follow)
    "floater-table2": ("ape-sinusoidal", "ape-sinusoidal-all", "ape-learned", "ape-learned-all", "floater-input",
                       "floater"),
    # scripts/recipes/bert-cpu.sh and bert-pretrain.sh (Wang et al. 2021's BERT comparison)
    "bert-cpu": ("ape-learned", "ape-sinusoidal", "ape-learnable-sin", "rpe-learned", "floater"),
    "bert-pretrain": ("ape-learned", "ape-sinusoidal", "ape-learnable-sin", "rpe-learned", "rpe-sinusoidal",
                      "rpe-learnable-sin", "ape-learned+rpe-learned", "ape+rpe-learnable-sin", "floater"),
    # fairseq-pe-gpu-check, in the order of their value on a GPU: the widely used encodings and those whose attention
    # takes each path first (APE, RoPE: no mask; ALiBi: a fixed bias; T5 and KERPLE: a learned bias; Shaw: blockwise;
    # FoX, CoPE, DAPE: the logits hook), then the rest
    "gpu-check": ("ape-sinusoidal", "rope", "alibi", "t5", "kerple-power", "rpe-learned", "xpos", "fire", "sandwich",
                  "fox", "cope", "kerple-log-dape", "floater-bias", "kerple-log", "ape-learned", "none", "ape-learnable-sin",
                  "rpe-sinusoidal", "rpe-learnable-sin", "floater", "floater-input", "rope-random",
                  "ape-sinusoidal-random") + ROTARY_2024 + ("alibi-dape2",),
    # bert-pretrain.sh's base mode (a pretrained RoBERTa continued): FLOATER as biases on its learned table
    "bert-pretrain-base": ("ape-learned", "ape-sinusoidal", "ape-learnable-sin", "rpe-learned", "rpe-sinusoidal",
                           "rpe-learnable-sin", "ape-learned+rpe-learned", "ape+rpe-learnable-sin",
                           "ape-learned+floater-bias"),
    # scripts/benchmark_analysis.py
    "analysis-benchmark": ("ape-sinusoidal", "ape-learned", "ape-learnable-sin", "rpe-learned",
                           "ape+rpe-learnable-sin", "floater", "t5"),
    # one system per encoding, FLOATER in its three forms: what tests/helpers.py's ALL_ENCODINGS runs
    "encodings": ("none", "ape-learned", "ape-sinusoidal", "ape-learnable-sin-all", "rpe-learned", "rpe-sinusoidal",
                  "rpe-learnable-sin", "rope", "xpos", "alibi", "t5", "kerple-log", "kerple-power", "sandwich", "fire",
                  "floater-input", "floater", "floater-bias", "p-rope", "rope-resonance", "fope") + DATA_DEPENDENT_2024,
    # a sinusoidal APE, a learned APE at every block, Shaw's RPE, RoPE, ALiBi, T5, KERPLE, FIRE, FLOATER at every
    # block and as biases: the tests' representative subset (tests/test_fairseq_features_cli.py)
    # docs/speed.md's long-context run (fairseq-pe-benchmark --long): every bias, the Shaw RPE, RoPE, an APE and
    # FLOATER's Q/K/V biases
    "long-context": ("alibi", "t5", "kerple-log", "kerple-power", "sandwich", "fire", "rpe-learned", "rope",
                     "ape-sinusoidal", "floater-bias"),
    "representative": ("ape-sinusoidal", "rpe-learned", "rope", "alibi", "t5", "kerple-power", "fire", "floater-bias",
                       "ape-learned-all", "floater"),
    # the encodings tests/test_roberta_pe.py runs in roberta_pe (beside BERT's learned APE)
    "roberta": ("ape-sinusoidal", "ape-learnable-sin", "rpe-learned", "rpe-learnable-sin", "ape-learned+rpe-sinusoidal",
                "rope", "alibi", "t5", "kerple-log", "sandwich", "fire", "floater"),
    # the encodings the tests train with randomised positions (one of each kind of position use)
    "randomised": ("ape-sinusoidal", "rope", "xpos", "alibi", "t5", "kerple-power", "sandwich", "fire", "rpe-learned"),
    # scripts/recipes/lm-wiki103.sh (the GPU recipe): ALiBi's Figure 1 encodings and KERPLE's logarithmic kernel
    # (Chi et al. 2022, Table 3)
    "lm-wiki103": ("ape-sinusoidal", "rope", "t5", "alibi", "kerple-log"),
}
# scripts/recipes/s2l-cpu-captions.sh: the quickstart's systems and the extrapolation encodings, in its tables' order
GROUPS["s2l-cpu-captions"] = GROUPS["quickstart"] + ("kerple-log", "kerple-power", "sandwich", "fire", "xpos",
                                                     "ape-sinusoidal-random", "rope-random")
# the encodings of 2024-2025 (issue 43) in the captions comparison, beside RoPE, ALiBi and KERPLE (log) as anchors:
# the rotary variants, FoX, CoPE, and DAPE v1 on ALiBi and on KERPLE (its papers' main bases) and v2 on ALiBi
GROUPS["s2l-cpu-captions-2024"] = ("rope", "alibi", "kerple-log") + ROTARY_2024 + ("fox", "cope", "alibi-dape",
                                                                                 "kerple-log-dape", "alibi-dape2")
# scripts/recipes/lm-cpu-counting.sh, CoPE's counting task: the paper's three (a learned absolute table, the
# reference's learned relative one, CoPE) beside no positions, RoPE, ALiBi and FoX
GROUPS["lm-cpu-counting"] = ("ape-learned", "rpe-learned", "cope", "none", "rope", "alibi", "fox")
# scripts/recipes/lm-cpu-extrapolation.sh SCALE=context (issue 58): the encodings of ALiBi's Figure 1 and KERPLE's
# Table 3 beside no positions, FIRE in its paper's form and in DAPE's, and FLOATER's best extrapolating form (its
# Q/K/V biases: docs/results.md's first language-model run)
GROUPS["lm-context"] = ("none", "ape-sinusoidal", "rope", "alibi", "t5", "kerple-log", "fire", "fire-dape",
                        "floater-bias")
# every system fairseq-pe-quickstart knows by name before the catalogue (count_ops, gpu_check start from it)
GROUPS["translation"] = GROUPS["quickstart"] + ("ape-sin+rpe-learned",) + GROUPS["extrapolation"]
# fairseq-pe-benchmark: the translation systems, FLOATER at the input beside every block, fairseq's
# sinusoids beside the plugin's, and the biases' randomised forms (a distance table, a per-row pass)
GROUPS["benchmark"] = tuple(
    extra for name in GROUPS["translation"] if name != "ape-sin+rpe-learned"
    for extra in {"floater": ("floater-input", "floater"),
                  "ape-sinusoidal": ("ape-sinusoidal", "ape-sinusoidal-fairseq")}.get(name, (name,))
) + ("sandwich-random", "fire-random") + ROTARY_2024 + DATA_DEPENDENT_2024 \
    + ("alibi-dape", "alibi-dape2", "kerple-log-dape2")


def canonical(name: str) -> str:
    """The catalogue's name of ``name`` (an alias resolved); KeyError with the names when unknown."""
    name = ALIASES.get(name, name)
    if name not in SYSTEMS:
        raise KeyError(f"unknown system {name!r}; known: {' '.join(SYSTEMS)}")
    return name


def get(name: str) -> System:
    return SYSTEMS[canonical(name)]


def flags(name: str) -> List[str]:
    """The ``--pe-*`` flags of a named system (a fresh list)."""
    return list(get(name).flags)


def group(name: str) -> Dict[str, List[str]]:
    """A named group: system name -> flags, in the group's order."""
    return {n: flags(n) for n in GROUPS[name]}


def _group(name: str) -> Dict[str, List[str]]:
    if name not in GROUPS:
        raise KeyError(f"unknown group {name!r}; known: {' '.join(GROUPS)}")
    return group(name)


def _table() -> str:
    rows = []
    for s in SYSTEMS.values():
        can = [what for what, yes in (("randomisable", s.randomisable), ("floater", s.floater),
                                      ("warm-started", s.warm_start is not None)) if yes]
        rows.append(f"{s.name:28} {' '.join(s.flags):70} {','.join(can)}".rstrip())
    return "\n".join(rows)


def get_parser():
    import argparse

    p = argparse.ArgumentParser(prog="python -m fairseq_pe.systems", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("flags", help="the --pe-* flags of a system, one line").add_argument("name")
    sub.add_parser("canonical", help="the catalogue's name of each NAME (an alias resolved)").add_argument(
        "names", nargs="+", metavar="NAME")
    sub.add_parser("names", help="the names of a group, one line").add_argument("group")
    sub.add_parser("group", help='a line "NAME FLAGS..." per system of a group').add_argument("group")
    sub.add_parser("groups", help="the groups' names")
    sub.add_parser("table", help="every system, its flags and capabilities")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = get_parser().parse_args(argv)
    try:
        if args.command == "flags":
            print(" ".join(flags(args.name)))
        elif args.command == "canonical":
            print(" ".join(canonical(name) for name in args.names))
        elif args.command == "names":
            print(" ".join(_group(args.group)))
        elif args.command == "group":
            print("\n".join(f"{name} {' '.join(f)}" for name, f in _group(args.group).items()))
        elif args.command == "groups":
            print(" ".join(GROUPS))
        else:
            print(_table())
    except KeyError as e:
        print(f"python -m fairseq_pe.systems: error: {e.args[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
