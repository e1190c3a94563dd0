"""Analyse checkpoints and write the results: PNG pictures, a JSON of every score, the proximity
matrices (``matrices.npz``) and a Markdown report per checkpoint, plus one table of property
scores across checkpoints.

What is analysed is the encoder (RoBERTa's sentence encoder), or with ``side="decoder"`` a
translation model's decoder: its absolute vectors (every block when each block gets its own), its
relative vectors (Shaw-style encodings), the first layer's identical-word logits (on the decoder,
only keys up to the query: the others are NaN) and learned frequencies.  A position table without a
model (a ``.npy``/``.pt`` table, a Hugging Face model's: :mod:`.tables`) gets the analyses of its
absolute vectors only (:func:`analyze_table`); what it skips, and why, is in its ``skipped``.  The
definitions of the scores are in :mod:`fairseq_pe.analysis.properties` and in ``docs/analysis.md``.
"""

import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_pe.errors import UserError
from fairseq_pe.outputs import atomic_path, check_new_files, write_json, write_text
from fairseq_pe.positional.injector import UNLIMITED_POSITIONS, PositionInjector

from . import plots
from .checkpoint import LoadedCheckpoint
from .frequencies import fixed_psi_window, learned_frequencies
from .probes import regression_probe
from .properties import direction_asymmetry, property_scores, proximity
from .tables import PositionTable
from .vectors import (SIDES, absolute_vectors, averaged_identical_word_logits, floater_bias_vectors, relative_vectors,
                      side_of)

logger = logging.getLogger("fairseq_pe.analysis")

DEFAULT_LENGTH = 128  # the paper's figures show the first 128 positions
DEFAULT_PROBE_LENGTH = 512
DEFAULT_NUM_TOKENS = 100


class AnalysisError(UserError):
    """Bad options for a checkpoint; the message names the option."""


#: every file :func:`write_checkpoint` may write into OUT/NAME/, and :func:`write_comparison` into OUT/
CHECKPOINT_FILES = ("report.md", "scores.json", "matrices.npz", "absolute.png", "relative.png",
                    "identical-word.png", "profiles.png", "frequencies.png", "probe.png", "norms.png")
COMPARISON_FILES = ("properties.json", "properties.md", "identical-word.png", "absolute.png", "norms.png",
                    "report.md")


@dataclass
class AnalysisOptions:
    length: Optional[int] = None  # positions of the matrices; None: 128, or fewer if the table is shorter
    probe_length: Optional[int] = None  # positions of the regression probe; None: 512 or the table size
    num_tokens: Optional[int] = None  # random words averaged in identical-word probing; None: 100 or all words
    max_offset: int = 32  # offsets m1 < m2 <= max_offset counted in the Eq. 2 share
    seed: int = 0
    side: str = "encoder"  # or "decoder" (translation models)
    trained_length: Optional[int] = None  # marked on the norm curve; None: the checkpoint's record, if any


def max_abs_up_to(matrix: torch.Tensor) -> List[float]:
    """For each position i, the largest |a_rj| over queries r ≤ i and keys j ≤ i: the largest logit a
    sequence of i + 1 positions holds (NaN entries, keys a decoder's query never sees, are skipped)."""
    m = matrix.detach().double().abs().nan_to_num(nan=0.0)
    return [round(float(x), 6) for x in m.cummax(dim=0).values.cummax(dim=1).values.diagonal()]


@dataclass
class Analysis:
    name: str
    scores: Dict[str, object]  # JSON-able
    matrices: Dict[str, torch.Tensor]  # name -> (L, L) or (H, L, L), for pictures and matrices.npz


def position_limit(model, side: str = "encoder") -> Optional[int]:
    """How many positions the absolute encoding of ``side`` holds (None: any length)."""
    injector = side_of(model, side).embed_positions
    if injector is None:
        return None
    if isinstance(injector, PositionInjector):
        limit = injector.max_positions
        return None if limit >= UNLIMITED_POSITIONS else int(limit)
    from fairseq.modules import LearnedPositionalEmbedding

    if isinstance(injector, LearnedPositionalEmbedding):  # fairseq's table; its sinusoids work at any length
        return int(injector.max_positions)
    return None


def _length(requested: Optional[int], default: int, limit: Optional[int], trained: Optional[int], flag: str,
            where: str) -> int:
    """The positions to use: ``requested``, or the default capped at the table size and at the
    training length when the checkpoint records it (rows beyond it were never trained)."""
    if requested is None:
        return min(n for n in (default, limit, trained) if n is not None)
    if requested < 4:
        raise AnalysisError(f"{flag} must be at least 4, got {requested}")
    if limit is not None and requested > limit:
        raise AnalysisError(f"{where}: {flag} {requested}, but its position table holds only {limit} positions; "
                            f"pass {flag} {limit} or less")
    return requested


def _count(requested: Optional[int], default: int, words: int, where: str) -> int:
    if requested is None:
        return min(default, words)
    if not 1 <= requested <= words:
        raise AnalysisError(f"{where}: --num-tokens {requested}, but its dictionary has {words} words "
                            "(specials, <mask>, language tags and madeupword padding excluded)")
    return requested


def _check_values(options: AnalysisOptions):
    """The checks of ``options`` that hold for every input."""
    if options.side not in SIDES:
        raise AnalysisError(f"--side must be one of {', '.join(SIDES)}, not {options.side!r}")
    if options.max_offset < 1:
        raise AnalysisError(f"--max-offset must be >= 1, got {options.max_offset}")
    if options.trained_length is not None and options.trained_length < 1:
        raise AnalysisError(f"--trained-length must be >= 1, got {options.trained_length}")


def check_options(checkpoint: LoadedCheckpoint, options: AnalysisOptions) -> Dict[str, object]:
    """Validate ``options`` for ``checkpoint`` and resolve the defaults: {"side", "length",
    "probe_length", "num_tokens", "limit", "trained_length"}.  Errors name the checkpoint."""
    where = checkpoint.path
    side = options.side
    _check_values(options)
    if side == "decoder" and checkpoint.family != "translation":
        raise AnalysisError(f"--side decoder: {where} is a {checkpoint.family} model, which has no decoder")
    limit = position_limit(checkpoint.model, side)
    trained = checkpoint.trained_length if side == "encoder" else None
    dictionary = checkpoint.dictionary if side == "encoder" else checkpoint.target_dictionary
    words = len(dictionary) - len(set(checkpoint.non_words(side)))
    return {"side": side, "limit": limit, "trained_length": trained,
            "marked_length": options.trained_length or trained,
            "length": _length(options.length, DEFAULT_LENGTH, limit, trained, "--length", where),
            "probe_length": _length(options.probe_length, DEFAULT_PROBE_LENGTH, limit, trained, "--probe-length", where),
            "num_tokens": _count(options.num_tokens, DEFAULT_NUM_TOKENS, words, where)}


def check_table_options(table: PositionTable, options: AnalysisOptions) -> Dict[str, object]:
    """Validate ``options`` for a position table and resolve {"limit", "length", "probe_length"}
    (``num_tokens`` and ``seed`` apply to the checkpoints of a run only).  Errors name the table."""
    _check_values(options)
    if options.side != "encoder":
        raise AnalysisError(f"--side {options.side}: {table.path} is a position table, which has no decoder "
                            "(--side applies to translation checkpoints)")
    limit = table.vectors.size(0)
    return {"limit": limit,
            "length": _length(options.length, DEFAULT_LENGTH, limit, None, "--length", table.path),
            "probe_length": _length(options.probe_length, DEFAULT_PROBE_LENGTH, limit, None, "--probe-length",
                                    table.path)}


def absolute_scores(vectors: Dict[int, torch.Tensor], length: int, probe_length: int,
                    max_offset: int) -> Tuple[Dict[str, object], Dict[str, torch.Tensor]]:
    """Block -> (at least max(length, probe_length), D) absolute vectors -> (their scores: dot-product
    and cosine property scores over ``length`` positions, the regression probe over ``probe_length``,
    the norms; their matrices, named as in matrices.npz)."""
    scores, matrices = {}, {}
    for block, v in vectors.items():
        dot, cos = proximity(v[:length]), proximity(v[:length], "cosine")
        matrices[f"absolute_dot_block{block}"] = dot
        matrices[f"absolute_cosine_block{block}"] = cos
        scores[str(block)] = {"dot": property_scores(dot, max_offset, gram=True),
                              "cosine": property_scores(cos, max_offset, gram=True),
                              "probe": regression_probe(v[:probe_length]),
                              "norms": [round(float(x), 6) for x in v[:length].norm(dim=-1)]}
    return scores, matrices


#: the analyses a position table without its model does not get, and why (``skipped`` in scores.json)
TABLE_SKIPS = {
    "identical_word": "needs a model's first attention layer and word embeddings, which a position table lacks (of "
                      "a Hugging Face model only the position table is read)",
    "relative": "belong to a model's attention, and a position table holds absolute vectors only",
    "frequencies": "exist in fairseq-pe's learnable-sinusoidal encodings only",
}


def analyze_table(table: PositionTable, name: str, options: AnalysisOptions = AnalysisOptions()) -> Analysis:
    """The analyses of a position table's absolute vectors (as :func:`analyze` does them for a
    checkpoint's): dot products, cosines and their property scores, norms and the regression probe."""
    start = time.time()
    resolved = check_table_options(table, options)
    length, probe_length = resolved["length"], resolved["probe_length"]
    absolute, matrices = absolute_scores({1: table.vectors}, length, probe_length, options.max_offset)
    scores: Dict[str, object] = {
        "name": name, "input": table.kind, "checkpoint": os.path.abspath(table.path), "arch": table.model_type,
        "family": table.kind, "encoding": table.description, "side": "encoder", "dictionary": None,
        "embed_dim": int(table.vectors.size(1)), "layers": None, "heads": None,
        "position_limit": resolved["limit"], "trained_length": options.trained_length, "options": asdict(options),
        "length": length, "probe_length": probe_length,
        "table": {"source": table.source, "positions": resolved["limit"], "dropped_rows": table.dropped_rows,
                  "note": table.note or None},
        "absolute": absolute, "floater_bias": None, "relative": None, "num_tokens": None, "identical_word": None,
        "frequencies": [], "fixed_psi_window": {}, "skipped": dict(TABLE_SKIPS),
    }
    scores["seconds"] = round(time.time() - start, 2)
    logger.info(f"{name}: position table of {resolved['limit']} positions ({scores['seconds']:.1f}s)")
    return Analysis(name=name, scores=scores, matrices=matrices)


def analyze(checkpoint: LoadedCheckpoint, name: str, options: AnalysisOptions = AnalysisOptions()) -> Analysis:
    """Every score and matrix of one checkpoint (see the module docstring)."""
    start = time.time()
    model = checkpoint.model
    resolved = check_options(checkpoint, options)
    side, limit, length, probe_length = (resolved[k] for k in ("side", "limit", "length", "probe_length"))
    stack = side_of(model, side)
    scores: Dict[str, object] = {
        "name": name, "input": "checkpoint", "checkpoint": os.path.abspath(checkpoint.path), "arch": checkpoint.arch,
        "family": checkpoint.family, "encoding": checkpoint.encoding(side), "side": side,
        "dictionary": checkpoint.dictionary_source,
        "embed_dim": int(stack.embed_tokens.embedding_dim), "layers": len(stack.layers),
        "heads": stack.layers[0].self_attn.num_heads,
        "position_limit": limit, "trained_length": resolved["marked_length"], "options": asdict(options),
        "length": length, "probe_length": probe_length, "skipped": {},
    }
    matrices: Dict[str, torch.Tensor] = {}

    def scored(matrix, gram=False):
        return property_scores(matrix, options.max_offset, gram=gram)

    # absolute vectors: proximity, properties, regression probe (per block)
    vectors = absolute_vectors(model, max(length, probe_length), side)
    if vectors:
        scores["absolute"], absolute_matrices = absolute_scores(vectors, length, probe_length, options.max_offset)
        matrices.update(absolute_matrices)
        logger.info(f"{name}: absolute vectors of {len(vectors)} block(s) ({time.time() - start:.1f}s)")
    else:
        scores["absolute"] = None
        scores["probe_length"] = None

    # FLOATER's Q/K/V biases (their size against position: bounded or not past the trained length)
    biases = floater_bias_vectors(model, length, side)
    scores["floater_bias"] = {str(b): {kind: [round(float(x), 6) for x in v[:, i].norm(dim=-1)]
                                       for i, kind in enumerate("qkv")} for b, v in biases.items()} or None

    # relative vectors a^K (and a^V when they differ): dot products over distances -K..K; a decoder
    # only looks back, so there only -K..0 (the vectors of keys after the query are never used)
    relative = relative_vectors(model, side)
    if relative:
        out = {}
        k = (next(iter(relative.values()))[0].size(-2) - 1) // 2
        last = k if side == "encoder" else 0
        for block, (key, value) in relative.items():
            entry = {}
            for kind, vec in (("key", key), ("value", value)):
                if kind == "value" and torch.equal(key, value):
                    continue
                used = vec[..., :k + last + 1, :]
                dot = proximity(used) if used.dim() == 2 else torch.stack([proximity(h) for h in used]).mean(0)
                matrices[f"relative_{kind}_dot_block{block}"] = dot
                entry[kind] = scored(dot, gram=True)
                # a decoder never uses r > 0, so forward against backward means nothing there
                entry[kind]["direction_asymmetry"] = direction_asymmetry(vec) if side == "encoder" else None
            out[str(block)] = entry
        scores["relative"] = {"max_distance": k, "distances": [-k, last], "blocks": out,
                              "same_key_value": "value" not in out["1"]}
        logger.info(f"{name}: relative vectors ({time.time() - start:.1f}s)")
    else:
        scores["relative"] = None

    # identical-word probing: first layer, per head and averaged over heads
    dictionary = checkpoint.dictionary if side == "encoder" else checkpoint.target_dictionary
    num_tokens = scores["num_tokens"] = resolved["num_tokens"]
    logits = averaged_identical_word_logits(model, dictionary, length, num_tokens, options.seed,
                                            exclude=set(checkpoint.non_words(side)), side=side)
    matrices["identical_word_heads"] = logits
    matrices["identical_word_mean"] = logits.mean(0)
    scores["identical_word"] = {"mean": scored(logits.mean(0)), "heads": [scored(h) for h in logits],
                                "max_abs_up_to": max_abs_up_to(logits.mean(0))}
    logger.info(f"{name}: identical-word probing over {num_tokens} words ({time.time() - start:.1f}s)")

    scores["frequencies"] = learned_frequencies(model, side=side)
    scores["fixed_psi_window"] = fixed_psi_window(model, side)
    scores["seconds"] = round(time.time() - start, 2)
    return Analysis(name=name, scores=scores, matrices=matrices)


# ---------------------------------------------------------------------------------------------
# writing


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value)


SCORE_COLUMNS = ["translation_invariance", "window_right", "window_left", "eq2_share", "symmetry"]
SCORE_HEADER = "| translation invariance ↓ | window → | window ← | Eq. 2 share | symmetry ↓ |"
# vectors' dot products: symmetric by construction (no symmetry column); relative vectors instead
# get the asymmetry between the vectors of r and -r
VECTOR_COLUMNS = SCORE_COLUMNS[:4]
VECTOR_HEADER = "| translation invariance ↓ | window → | window ← | Eq. 2 share |"


def _score_cells(s: Optional[dict]) -> str:
    return " | ".join(_fmt(s.get(c) if s else None) for c in SCORE_COLUMNS)


def _score_rows(a: Analysis) -> List[tuple]:
    """(what, scores) for every matrix of a checkpoint."""
    rows = []
    for block, entry in (a.scores["absolute"] or {}).items():
        rows.append((f"absolute vectors, block {block}, dot product", entry["dot"]))
        rows.append((f"absolute vectors, block {block}, cosine", entry["cosine"]))
    for block, entry in ((a.scores["relative"] or {}).get("blocks") or {}).items():
        for kind, s in entry.items():
            rows.append((f"relative vectors a^{kind[0].upper()}, block {block}, dot product "
                         f"(a_r vs a_−r asymmetry {_fmt(s['direction_asymmetry'])})", s))
    if a.scores["identical_word"]:
        rows.append(("identical-word logits, mean of heads", a.scores["identical_word"]["mean"]))
        for h, s in enumerate(a.scores["identical_word"]["heads"]):
            rows.append((f"identical-word logits, head {h + 1}", s))
    return rows


def logit_maxima(scores: dict) -> List[float]:
    """The largest |identical-word logit| among positions 0..i (empty when not probed: a table)."""
    return scores["identical_word"]["max_abs_up_to"] if scores["identical_word"] else []


def write_checkpoint(a: Analysis, out_dir: str) -> Dict[str, str]:
    """Pictures, scores.json, matrices.npz and report.md of one checkpoint; returns the picture paths."""
    import numpy as np

    os.makedirs(out_dir, exist_ok=True)
    s = a.scores
    pictures = {}
    length = s["length"]

    def picture(key, filename):
        pictures[key] = os.path.join(out_dir, filename)
        return pictures[key]

    def draw(fn, *args, path, **kwargs):  # each picture written atomically
        with atomic_path(path) as tmp:
            fn(*args, tmp, **kwargs)

    if s["absolute"]:
        blocks = sorted(s["absolute"], key=int)
        panels = []
        for b in blocks:
            label = f"block {b}, " if len(blocks) > 1 else ""
            panels.append((f"{label}dot product", a.matrices[f"absolute_dot_block{b}"]))
            panels.append((f"{label}cosine", a.matrices[f"absolute_cosine_block{b}"]))
        draw(plots.heatmap_grid, panels, path=picture("absolute", "absolute.png"),
             title=f"{a.name}: absolute position vectors, positions 0..{length - 1}")
        probe = [(f"block {b}" if len(blocks) > 1 else a.name, list(range(1, s["probe_length"], 2)),
                  s["absolute"][b]["probe"]["errors"]) for b in blocks]
        draw(plots.probe_plot, probe, path=picture("probe", "probe.png"))
    if s["relative"]:
        first, last = s["relative"]["distances"]
        panels = [(f"a^{key.split('_')[1][0].upper()} block {key.rsplit('block', 1)[1]}", m)
                  for key, m in a.matrices.items() if key.startswith("relative_")]
        draw(plots.heatmap_grid, panels, path=picture("relative", "relative.png"),
             title=f"{a.name}: dot products of relative position vectors", ticks=(first, last),
             xlabel="distance", ylabel="distance")
    curves = []
    if s["identical_word"]:
        heads = a.matrices["identical_word_heads"]
        draw(plots.heatmap_grid, [("mean of heads", a.matrices["identical_word_mean"])]
             + [(f"head {h + 1}", m) for h, m in enumerate(heads)],
             path=picture("identical_word", "identical-word.png"),
             title=f"{a.name}: first-layer logits of identical-word sequences, {s['num_tokens']} words", columns=5,
             xlabel="key position j", ylabel="query position i")
        curves.append(("identical-word logits (mean of heads)", a.matrices["identical_word_mean"]))
    if s["absolute"]:
        curves.insert(0, ("absolute vectors, dot product (block 1)", a.matrices["absolute_dot_block1"]))
    draw(plots.profile_plot, curves, path=picture("profiles", "profiles.png"), max_offset=min(64, length - 1),
         title=a.name)
    if s["frequencies"]:
        draw(plots.frequency_plot, s["frequencies"], path=picture("frequencies", "frequencies.png"))
    norms = [(f"block {b}", e["norms"]) for b, e in sorted((s["absolute"] or {}).items(), key=lambda x: int(x[0]))]
    norms += [(f"block {b} bias {kind}", e[kind]) for b, e in
              sorted((s.get("floater_bias") or {}).items(), key=lambda x: int(x[0])) for kind in "qkv"]
    draw(plots.norm_plot, norms, logit_maxima(s), path=picture("norms", "norms.png"),
         trained_length=s["trained_length"], title=a.name)

    write_json(os.path.join(out_dir, "scores.json"), s)
    with atomic_path(os.path.join(out_dir, "matrices.npz")) as tmp:
        np.savez_compressed(tmp, **{k: v.detach().numpy() for k, v in a.matrices.items()})
    # pictures of an earlier run that this one does not draw (e.g. relative.png of another encoding)
    for stale in set(CHECKPOINT_FILES) - {"report.md", "scores.json", "matrices.npz"} \
            - {os.path.basename(p) for p in pictures.values()}:
        if os.path.isfile(os.path.join(out_dir, stale)):
            os.remove(os.path.join(out_dir, stale))
    write_text(os.path.join(out_dir, "report.md"),
               checkpoint_markdown(a, {k: os.path.basename(p) for k, p in pictures.items()}))
    return pictures


def _table_settings(s: dict) -> List[str]:
    """The settings lines of report.md for a position table."""
    table = s["table"]
    what = "a Hugging Face model folder" if s["input"] == "huggingface" else "a position table"
    lines = [f"- input: `{s['checkpoint']}`, {what} ({table['source']}): {table['positions']} positions, "
             f"D = {s['embed_dim']}",
             f"- position encoding: {s['encoding']}"]
    if table["note"]:
        lines.append(f"- {table['note']}")
    lines.append(f"- matrices over positions 0..{s['length'] - 1}; probe over 0..{s['probe_length'] - 1}; Eq. 2 "
                 f"share over offsets up to {s['options']['max_offset']} (up to L − 1 for smaller matrices: "
                 "`max_offset_used` in scores.json)")
    if s["trained_length"]:
        lines.append(f"- trained on sequences of {s['trained_length']} tokens")
    return lines + [f"- scores computed in {s['seconds']} s"]


def checkpoint_markdown(a: Analysis, pictures: Dict[str, str]) -> str:
    s = a.scores
    if s["input"] != "checkpoint":
        return _markdown_body(a, pictures, [f"# Position analysis: {a.name}", ""] + _table_settings(s))
    lines = [f"# Position analysis: {a.name}", "",
             f"- checkpoint: `{s['checkpoint']}`",
             f"- `--arch {s['arch']}` ({s['family']}), {s['side']}: D = {s['embed_dim']}, {s['layers']} layers, "
             f"{s['heads']} heads",
             f"- position encoding: {s['encoding']}",
             f"- matrices over positions 0..{s['length'] - 1}"
             + (f"; probe over 0..{s['probe_length'] - 1}" if s["probe_length"] else "")
             + f"; identical-word probing averaged over {s['num_tokens']} random words (seed "
             f"{s['options']['seed']}); Eq. 2 share over offsets up to {s['options']['max_offset']} (up to L − 1 "
             "for smaller matrices: `max_offset_used` in scores.json)",
             f"- dictionary: {s['dictionary']}"
             + (f"; trained on sequences of {s['trained_length']} tokens" if s["trained_length"] else ""),
             f"- scores computed in {s['seconds']} s"]
    return _markdown_body(a, pictures, lines)


def _markdown_body(a: Analysis, pictures: Dict[str, str], lines: List[str]) -> str:
    """report.md from its title and settings ``lines`` on: the scores, pictures and skips."""
    s = a.scores
    lines += ["", "## Property scores", "",
              "Definitions: docs/analysis.md, *The scores* (translation invariance and symmetry: 0 is exact; "
              "window: how many offsets φ(x, x+m) keeps strictly decreasing, median over x).", "",
              "| matrix " + SCORE_HEADER, "|---|---|---|---|---|---|"]
    lines += [f"| {what} | {_score_cells(sc)} |" for what, sc in _score_rows(a)]
    if "absolute" in pictures:
        lines += ["", "## Absolute position vectors (Fig. 2, top row)", "", f"![absolute]({pictures['absolute']})"]
    if "relative" in pictures:
        lines += ["", "## Relative position vectors (Fig. 2, bottom row)", "", f"![relative]({pictures['relative']})"]
    if "identical_word" in pictures:
        lines += ["", "## Identical-word probing (§3.1 Eq. 5, §5.2 Fig. 3)", "",
                  f"![identical-word]({pictures['identical_word']})"]
    lines += ["", "## Offset profiles", "", f"![profiles]({pictures['profiles']})",
              "", "## Size against position (past the training length, if marked)", ""]
    if s["identical_word"]:
        lines += ["‖p_i‖ of the absolute vectors of each block (and of FLOATER's Q/K/V biases b_{q,k,v,i}), and "
                  "the largest |identical-word logit| among positions 0..i (first layer, mean of heads): an encoding "
                  "that extrapolates keeps both bounded past the trained length.", "", f"![norms]({pictures['norms']})"]
    else:
        lines += ["‖p_i‖ of the absolute vectors: an encoding that extrapolates keeps it bounded past the trained "
                  "length.", "", f"![norms]({pictures['norms']})"]
    if s["frequencies"]:
        lines += ["", "## Learned frequencies (App. A.5)", "",
                  "| frequencies | median \\|ω − ω₀\\| / ω₀ | ψ decreasing up to m (learned) | (initial) |",
                  "|---|---|---|---|"]
        lines += [f"| {e['name']} | {_fmt(e['median_relative_change'])} | {e['psi_window_learned']} | "
                  f"{e['psi_window_initial']} |" for e in s["frequencies"]]
        lines += ["", f"![frequencies]({pictures['frequencies']})"]
    if s["fixed_psi_window"]:
        lines += ["", "Fixed sinusoids: ψ(m) decreases up to m = " + ", ".join(
            f"{v} ({k})" for k, v in s["fixed_psi_window"].items()) + "."]
    if s["absolute"]:
        lines += ["", "## Position regression probe (trained on even positions, tested on odd ones)", "",
                  "| block | mean \\|error\\| | max \\|error\\| | share rounded exactly |", "|---|---|---|---|"]
        lines += [f"| {b} | {_fmt(e['probe']['mean_abs_error'])} | {_fmt(e['probe']['max_abs_error'])} | "
                  f"{_fmt(e['probe']['exact_share'])} |" for b, e in s["absolute"].items()]
        lines += ["", f"![probe]({pictures['probe']})"]
    if s["skipped"]:
        lines += ["", "## Not analysed", ""] + [f"- {what} {why}" for what, why in _skips(s)]
    return "\n".join(lines) + "\n"


#: the skipped analyses' names in reports (each followed by why: TABLE_SKIPS)
SKIP_NAMES = {"identical_word": "identical-word probing", "relative": "relative position vectors",
              "frequencies": "learned frequencies"}


def _skips(s: dict) -> List[Tuple[str, str]]:
    """(analysis, why) for each analysis skipped."""
    return [(SKIP_NAMES.get(k, k), why) for k, why in s["skipped"].items()]


# ---------------------------------------------------------------------------------------------
# several checkpoints


def summary_rows(analyses: Sequence[Analysis]) -> List[Dict[str, object]]:
    """One flat row of headline scores per checkpoint (block 1, dot products, mean of heads)."""
    rows = []
    for a in analyses:
        s = a.scores
        row = {"name": a.name, "encoding": s["encoding"] + (" (decoder)" if s["side"] == "decoder" else ""),
               "side": s["side"], "arch": s["arch"], "input": s["input"], "skipped": list(s["skipped"])}
        relative = ((s["relative"] or {}).get("blocks") or {}).get("1", {}).get("key")
        row["has_absolute"], row["has_relative"] = bool(s["absolute"]), relative is not None
        for prefix, sc in (("identical_word", (s["identical_word"] or {}).get("mean")),
                           ("absolute", (s["absolute"] or {}).get("1", {}).get("dot")),
                           ("relative", relative)):
            for c in SCORE_COLUMNS:
                row[f"{prefix}.{c}"] = sc[c] if sc else None
        row["relative.direction_asymmetry"] = relative["direction_asymmetry"] if relative else None
        probe = (s["absolute"] or {}).get("1", {}).get("probe")
        row["probe.mean_abs_error"] = probe["mean_abs_error"] if probe else None
        row["probe.exact_share"] = probe["exact_share"] if probe else None
        absolute_freq = [e for e in s["frequencies"] if e["name"] == "absolute"]
        row["psi_window_learned"] = absolute_freq[0]["psi_window_learned"] if absolute_freq else None
        rows.append(row)
    return rows


def summary_markdown(analyses: Sequence[Analysis]) -> str:
    rows = summary_rows(analyses)
    probed = [a for a in analyses if a.scores["identical_word"]]

    def shared(key, fmt):
        values = {a.name: a.scores[key] for a in probed}
        if len(set(values.values())) == 1:
            return fmt(next(iter(values.values())))
        return fmt("L") + " (" + ", ".join(f"{n}: {v}" for n, v in values.items()) + ")"

    out = []
    if probed:
        lengths = shared("length", lambda n: f"positions 0..{n - 1}" if isinstance(n, int) else f"{n} positions")
        words = shared("num_tokens", lambda n: f"{n} random words" if isinstance(n, int) else "random words")
        out += [f"Identical-word probing: first-layer attention logits, mean of heads, {lengths}, {words}.", "",
                "| checkpoint | encoding " + SCORE_HEADER, "|---|---|---|---|---|---|---|"]
        out += [f"| {r['name']} | {r['encoding']} | " + " | ".join(_fmt(r[f'identical_word.{c}'])
                                                                 for c in SCORE_COLUMNS)
                + " |" for r in rows if r["name"] in {a.name for a in probed}]
    with_abs = [r for r in rows if r["has_absolute"]]
    if with_abs:
        out += ["", "Absolute position vectors (block 1), dot products (symmetric by construction); the "
                "regression probe's mean |error| on odd positions.", "",
                "| checkpoint | encoding " + VECTOR_HEADER + " probe error | ψ window (learned ω) |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['name']} | {r['encoding']} | " + " | ".join(_fmt(r[f'absolute.{c}']) for c in VECTOR_COLUMNS)
                + f" | {_fmt(r['probe.mean_abs_error'])} | {_fmt(r['psi_window_learned'])} |" for r in with_abs]
    with_rel = [r for r in rows if r["has_relative"]]
    if with_rel:
        span = "−K..K" + (" (decoder: −K..0)" if any(r["side"] == "decoder" for r in with_rel) else "")
        out += ["", f"Relative position vectors a^K (block 1), dot products over distances {span}; asymmetry: "
                "‖a_r − a_−r‖ / ‖a‖ (0 when forward and backward distances share a vector).", "",
                "| checkpoint | encoding " + VECTOR_HEADER + " asymmetry |", "|---|---|---|---|---|---|---|"]
        out += [f"| {r['name']} | {r['encoding']} | " + " | ".join(_fmt(r[f'relative.{c}']) for c in VECTOR_COLUMNS)
                + f" | {_fmt(r['relative.direction_asymmetry'])} |" for r in with_rel]
    skipped = {}  # the same skips (a table's) named once, with the inputs they concern
    for a in analyses:
        if a.scores["skipped"]:
            skipped.setdefault(tuple(_skips(a.scores)), []).append(a.name)
    for skips, names in skipped.items():
        out += ["", f"Not analysed for {', '.join(names)} (position tables without their model): "
                + "; ".join(f"{what} {why}" for what, why in skips) + "."]
    return "\n".join(out[1:] if out and out[0] == "" else out) + "\n"


def largest_norms(scores: dict) -> List[float]:
    """The largest ‖state‖ at each position over a checkpoint's blocks: absolute vectors and FLOATER's
    Q/K/V biases (empty without either)."""
    curves = [e["norms"] for e in (scores.get("absolute") or {}).values()]
    curves += [e[kind] for e in (scores.get("floater_bias") or {}).values() for kind in "qkv"]
    return [max(values) for values in zip(*curves)] if curves else []


def write_comparison(analyses: Sequence[Analysis], out_dir: str) -> List[str]:
    """properties.json/.md, the comparison pictures and report.md of ``out_dir``; returns the files."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    write_json(os.path.join(out_dir, "properties.json"), summary_rows(analyses))
    table = summary_markdown(analyses)
    write_text(os.path.join(out_dir, "properties.md"), table)
    written += ["properties.json", "properties.md"]
    probed = [a for a in analyses if a.scores["identical_word"]]
    if probed:
        with atomic_path(os.path.join(out_dir, "identical-word.png")) as tmp:
            plots.heatmap_grid([(a.name, a.matrices["identical_word_mean"]) for a in probed], tmp,
                               "identical-word probing: first-layer logits, mean of heads", columns=5,
                               xlabel="key position j", ylabel="query position i")
        written.append("identical-word.png")
    elif os.path.isfile(os.path.join(out_dir, "identical-word.png")):  # an earlier run's, of checkpoints
        os.remove(os.path.join(out_dir, "identical-word.png"))
    with_abs = [a for a in analyses if a.scores["absolute"]]
    if with_abs:
        with atomic_path(os.path.join(out_dir, "absolute.png")) as tmp:
            plots.heatmap_grid([(a.name, a.matrices["absolute_dot_block1"]) for a in with_abs], tmp,
                               "dot products of absolute position vectors (block 1)", columns=5)
        written.append("absolute.png")
    elif os.path.isfile(os.path.join(out_dir, "absolute.png")):  # an earlier run's, of other checkpoints
        os.remove(os.path.join(out_dir, "absolute.png"))
    curves = [(a.name, largest_norms(a.scores), logit_maxima(a.scores)) for a in analyses]
    lengths = {a.scores["trained_length"] for a in analyses}
    with atomic_path(os.path.join(out_dir, "norms.png")) as tmp:
        plots.norm_comparison_plot(curves, tmp, trained_length=lengths.pop() if len(lengths) == 1 else None,
                                   title="size against position")
    written.append("norms.png")
    lines = ["# Position analysis", "", table]
    if probed:
        lines += ["![identical-word](identical-word.png)", ""]
    if with_abs:
        lines += ["![absolute](absolute.png)", ""]
    lines += ["![norms](norms.png)", ""]
    lines += ["Per checkpoint: " + ", ".join(f"[{a.name}]({a.name}/report.md)" for a in analyses), ""]
    write_text(os.path.join(out_dir, "report.md"), "\n".join(lines))
    written.append("report.md")
    return written


def default_names(paths: Sequence[str], kinds: Optional[Sequence[str]] = None) -> List[str]:
    """A name per input: a checkpoint's folder name (``systems/ape-learned/checkpoint_best.pt`` ->
    ``ape-learned``), a position table's file stem (``tables/bert.npy`` -> ``bert``), a Hugging Face
    model folder's name; when two would share a name, a checkpoint's gets the file's stem and a
    table's its folder's name (``ape-learned-checkpoint_best``, ``tables-bert``)."""
    kinds = list(kinds) if kinds else ["checkpoint"] * len(paths)
    full = [os.path.abspath(p) for p in paths]
    folder = [os.path.basename(os.path.dirname(p)) or "checkpoint" for p in full]
    stem = [os.path.basename(p) if k == "huggingface" else os.path.splitext(os.path.basename(p))[0]
            for p, k in zip(full, kinds)]
    first = [f if k == "checkpoint" else s for f, s, k in zip(folder, stem, kinds)]
    return [n if first.count(n) == 1 else f"{f}-{s}" for n, f, s in zip(first, folder, stem)]


def resolve_names(paths: Sequence[str], names: Optional[Sequence[str]] = None,
                  kinds: Optional[Sequence[str]] = None) -> List[str]:
    """One valid folder name per input: ``names``, or :func:`default_names`."""
    if not paths:
        raise AnalysisError("give at least one CHECKPOINT")
    names = list(names) if names else default_names(paths, kinds)
    if len(names) != len(paths):
        raise AnalysisError(f"--names gives {len(names)} names for {len(paths)} checkpoints")
    for n in names:
        if not n or "/" in n or n.startswith("."):
            raise AnalysisError(f"--names: {n!r} cannot be a folder name")
    if len(set(names)) != len(names):
        duplicated = sorted({n for n in names if names.count(n) > 1})
        raise AnalysisError(f"two checkpoints would be named {duplicated}: pass --names")
    return names


def planned_outputs(out_dir: str, names: Sequence[str]) -> List[str]:
    """Every file an analysis of checkpoints ``names`` may write into ``out_dir``."""
    return ([os.path.join(out_dir, f) for f in COMPARISON_FILES]
            + [os.path.join(out_dir, n, f) for n in names for f in CHECKPOINT_FILES])


def analyze_checkpoints(paths: Sequence[str], out_dir: str, names: Optional[Sequence[str]] = None,
                        options: AnalysisOptions = AnalysisOptions(), force: bool = True) -> List[Analysis]:
    """The Python API of ``fairseq-pe-analyze``: analyse every input (a checkpoint, or a position
    table: a ``.npy``/``.pt`` table or a Hugging Face model folder, see :mod:`.tables`), write
    ``out_dir/NAME/`` for each and the comparison (``properties.md/json``, ``report.md``, pictures)
    in ``out_dir``.

    ``force=False`` refuses (before any work) to replace the files of an earlier analysis, as the
    command does without ``--force``; no output is ever written over a checkpoint analysed."""
    from .checkpoint import load_checkpoint
    from .inputs import load_position_table
    from .tables import input_kind

    if not paths:
        raise AnalysisError("give at least one CHECKPOINT")
    kinds = [input_kind(path) for path in paths]  # a missing path is an error naming it
    names = resolve_names(paths, names, kinds)
    check_new_files(planned_outputs(out_dir, names), force, flag="--out", where=out_dir,
                    inputs=[("CHECKPOINT" if k == "checkpoint" else "INPUT", p) for p, k in zip(paths, kinds)])
    if options.num_tokens is not None and "checkpoint" not in kinds:
        raise AnalysisError("--num-tokens: identical-word probing needs a fairseq checkpoint, and every input is a "
                            "position table (" + ", ".join(paths) + ")")

    def load(path, kind):
        return load_checkpoint(path) if kind == "checkpoint" else load_position_table(path)

    def check(loaded, kind):
        return check_options(loaded, options) if kind == "checkpoint" else check_table_options(loaded, options)

    if len(paths) > 1 and (options.length is not None or options.probe_length is not None
                           or options.num_tokens is not None or options.side != "encoder"):
        # explicit options can fail for one input: find out before analysing any
        for path, kind in zip(paths, kinds):
            check(load(path, kind), kind)
    analyses = []
    for i, (path, kind, name) in enumerate(zip(paths, kinds, names), 1):
        start = time.time()
        logger.info(f"[{i}/{len(paths)}] {name}: loading {path}")
        loaded = load(path, kind)
        analysis = analyze(loaded, name, options) if kind == "checkpoint" else analyze_table(loaded, name, options)
        write_checkpoint(analysis, os.path.join(out_dir, name))
        logger.info(f"[{i}/{len(paths)}] {name}: loaded, analysed and written in {time.time() - start:.1f} s "
                    f"-> {out_dir}/{name}/report.md")
        analyses.append(analysis)
    if options.probe_length is not None and not any(a.scores["absolute"] for a in analyses):
        logger.warning("--probe-length had no effect: no checkpoint has absolute position vectors to probe")
    write_comparison(analyses, out_dir)
    return analyses
