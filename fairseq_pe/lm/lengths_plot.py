"""The pictures of ``fairseq-pe-lm-lengths`` (:mod:`fairseq_pe.lm.extrapolation`): ``lengths.png`` (perplexity
against evaluation length, absolute and relative to the shortest length) and ``positions.png`` (loss against the
position in the window), one line per system in the colours of :mod:`fairseq_pe.plotting`.

The relative panels: a system whose mean ratio to its perplexity at the shortest length exceeds
:data:`DIVERGING_RATIO` at some length (FLOATER's reaching 8x, say, where the others stay within 1.2x) is drawn in
a panel of its own, "diverging", so that it does not flatten the others' curves; the rest share one panel.  The
diverging panel's y axis turns logarithmic (base 2) once a ratio in it passes :data:`LOG_RATIO`, so that an
explosion (FLOATER's 20x) does not flatten the systems that merely diverge (RoPE's 2x) beside it.
"""

import math
from typing import Dict, List, Tuple

from fairseq_pe.lm.positions import BINS_PER_OCTAVE, binned

#: a system whose mean relative perplexity exceeds this at some length goes to the "diverging" panel
DIVERGING_RATIO = 1.5
#: a diverging panel whose largest ratio passes this is drawn on a log y axis
LOG_RATIO = 4.0
MODE_TITLES = {"nonoverlapping": "Non-overlapping windows", "sliding": "Sliding windows"}


def diverging(report: dict, mode: str) -> List[str]:
    """The systems of ``mode`` whose mean relative perplexity exceeds :data:`DIVERGING_RATIO` at some length."""
    out = []
    for system, cells in report["results"].items():
        ratios = [c["relative"] for c in cells[mode].values() if c.get("relative") is not None]
        if any(r > DIVERGING_RATIO for r in ratios if not math.isnan(r)):
            out.append(system)
    return out


def _legend_layout(report: dict) -> dict:
    count = len(report["results"])
    beside = count > 12  # the legend beside the panels, in columns, not over the curves
    return {"beside": beside, "columns": 1 + count // 14}


def _legend(fig, axes, layout: dict) -> None:
    """One legend of every system drawn (the first panel of each label), beside the last panel of the first row
    when there are many, else in the first panel."""
    handles: Dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if not handles:
        return
    if layout["beside"]:
        axes[0][-1].legend(handles.values(), handles.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                           ncol=layout["columns"])
    else:
        axes[0][0].legend(handles.values(), handles.keys(), fontsize=7, loc="best")


def _length_axis(ax, report: dict) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(report["lengths"])
    ax.set_xticklabels([str(n) for n in report["lengths"]])
    ax.axvline(report["train_length"], color="0.6", linewidth=0.8, linestyle=":")
    ax.set_xlabel("evaluation length N (tokens)")
    ax.grid(True, which="both", alpha=0.3)


def _absolute(ax, report: dict, mode: str, styles: dict) -> None:
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    lengths = report["lengths"]
    for system, cells in report["results"].items():
        xs = [n for n in lengths if "refused" not in cells[mode][str(n)]]
        ys = [cells[mode][str(n)]["perplexity"] for n in xs]
        sds = [cells[mode][str(n)]["perplexity_sd"] or 0.0 for n in xs]
        refused = [n for n in lengths if "refused" in cells[mode][str(n)]]
        label = system + (f" (refused from N = {refused[0]})" if refused else "")
        if xs:
            ax.errorbar(xs, ys, yerr=sds if any(sds) else None, label=label, capsize=2, markersize=5,
                        **styles[system])
    _length_axis(ax, report)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    low, high = ax.get_ylim()  # minor ticks labelled within a decade only (they crowd a wider range)
    ax.yaxis.set_minor_formatter(ScalarFormatter() if high < 10 * low else NullFormatter())
    ax.set_title(MODE_TITLES[mode] + ("" if mode == "nonoverlapping" else f" (stride {report['stride']})"),
                 fontsize=10)
    ax.set_ylabel(f"perplexity ({report['gen_subset']})")


def _relative(ax, report: dict, mode: str, systems: List[str], styles: dict, title: str,
              log_past: float = math.inf) -> None:
    """Each system's perplexity over the same seed's at the shortest length: mean ± sd over seeds; linear y, or log
    (base 2) where a ratio passes ``log_past``."""
    from matplotlib.ticker import FormatStrFormatter

    lengths = report["lengths"]
    top = 0.0
    for system in systems:
        cells = report["results"][system][mode]
        xs = [n for n in lengths if cells[str(n)].get("relative") is not None]
        if xs:
            ys = [cells[str(n)]["relative"] for n in xs]
            sds = [cells[str(n)].get("relative_sd") or 0.0 for n in xs]
            top = max([top] + [y for y in ys if not math.isnan(y)])
            ax.errorbar(xs, ys, yerr=sds if any(sds) else None, capsize=2,
                        markersize=5, label="_" + system, **styles[system])  # the legend: the absolute panel's
    _length_axis(ax, report)
    ax.axhline(1.0, color="0.6", linewidth=0.8)
    if top > log_past:
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        title += ", log scale"
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(f"perplexity / perplexity at N = {lengths[0]}")


def plot_lengths(report: dict, path: str) -> None:
    """``lengths.png``: a row per mode; its panels: the perplexity (log y), the perplexity relative to the shortest
    length of the systems within :data:`DIVERGING_RATIO` (linear y), and (where any) of the systems past it (linear
    y, log past :data:`LOG_RATIO`); the first alone for one length."""
    from fairseq_pe.outputs import savefig
    from fairseq_pe.plotting import pyplot, system_styles

    plt = pyplot()
    modes = report["modes"]
    styles = system_styles(list(report["results"]))
    apart = {mode: diverging(report, mode) for mode in modes}
    single = len(report["lengths"]) == 1  # one length: the perplexities alone (every ratio is 1)
    columns = 1 if single else 3 if any(apart.values()) else 2
    layout = _legend_layout(report)
    width = 5.0 * columns + (2.2 * layout["columns"] if layout["beside"] else 0)
    fig, axes = plt.subplots(len(modes), columns, figsize=(width, 3.9 * len(modes)), squeeze=False)
    for row, mode in zip(axes, modes):
        _absolute(row[0], report, mode, styles)
        if single:
            continue
        rest = [s for s in report["results"] if s not in apart[mode]]
        _relative(row[1], report, mode, rest, styles, "relative" + (f" (within {DIVERGING_RATIO}×)" if apart[mode]
                                                                   else ""))
        if columns == 3 and apart[mode]:
            _relative(row[2], report, mode, apart[mode], styles, f"relative, diverging (past {DIVERGING_RATIO}×)",
                      log_past=LOG_RATIO)
        elif columns == 3:
            row[2].axis("off")
            row[2].text(0.5, 0.5, f"no system past {DIVERGING_RATIO}×", ha="center", va="center")
    _legend(fig, axes, layout)
    fig.tight_layout()
    savefig(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def longest(curves: Dict[str, dict]) -> int:
    """The longest evaluation length of a system's curves in one mode (``{N: curve}``) that was not refused; 0 if
    none."""
    return max((int(n) for n, c in curves.items() if "refused" not in c), default=0)


def scored_segments(curves: Dict[str, dict], stride: int) -> List[Tuple[int, dict]]:
    """A system's sliding curves ``{N: curve}`` -> ``[(N, curve)]`` (N ascending, refusals left out), each holding
    only the positions its windows score with their full context, N − stride + 1..N (the counts elsewhere zeroed):
    the positions before hold the split's first windows alone, one token each, whose context is shorter."""
    out = []
    for n in sorted((int(k) for k, c in curves.items() if "refused" not in c)):
        first = max(1, n - stride + 1)
        curve = dict(curves[str(n)])
        curve["count"] = [0] * (first - 1) + list(curve["count"][first - 1:])
        out.append((n, curve))
    return out


def plot_positions(positions: dict, path: str) -> None:
    """``positions.png``: per mode, each system's mean loss (base 2) against the position in the window (non-overlapping
    windows: the joined curve, :func:`fairseq_pe.lm.positions.stitch`; sliding ones: every evaluated length's scored
    positions, :func:`scored_segments`), in geometric bins (:data:`BINS_PER_OCTAVE` per octave), the seeds' sd as a
    band, the training length L marked."""
    from fairseq_pe.outputs import savefig
    from fairseq_pe.plotting import pyplot, system_styles

    plt = pyplot()
    modes, L = positions["modes"], positions["train_length"]
    styles = system_styles(list(positions["results"]))
    layout = _legend_layout(positions)
    width = 6.0 * len(modes) + (2.2 * layout["columns"] if layout["beside"] else 0)
    fig, axes = plt.subplots(1, len(modes), figsize=(width, 4.2), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        top = max((longest(cells[mode]) for cells in positions["results"].values()), default=0)
        joined = mode == "nonoverlapping" and positions.get("stitched") is not None
        for system, cells in positions["results"].items():
            n = longest(cells[mode])
            if not n:
                continue
            if joined:
                segments = [(n, positions["stitched"][system])]
            elif mode == "sliding":
                segments = scored_segments(cells[mode], positions["stride"])
            else:
                segments = [(n, cells[mode][str(n)])]
            style = styles[system]
            for k, (_, curve) in enumerate(segments):
                b = binned(curve)
                ax.plot(b["x"], b["mean"], color=style["color"], linestyle=style["linestyle"], linewidth=1.2,
                        marker="." if len(segments) > 1 else None, markersize=3,
                        label=None if k else system + ("" if n == top else f" (to N = {n})"))
                if any(sd is not None for sd in b["sd"]):
                    sds = [sd or 0.0 for sd in b["sd"]]
                    ax.fill_between(b["x"], [m - s for m, s in zip(b["mean"], sds)],
                                    [m + s for m, s in zip(b["mean"], sds)], color=style["color"], alpha=0.18,
                                    linewidth=0)
        ax.set_xscale("log", base=2)
        ticks = [2 ** k for k in range(max(1, top).bit_length())]
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.axvline(L, color="0.4", linewidth=0.9, linestyle=":", label=f"L = {L}")
        ax.set_xlabel(f"position in the window (tokens; geometric bins, {BINS_PER_OCTAVE} per octave)")
        ax.set_ylabel(f"mean loss, bits per token ({positions['gen_subset']})")
        ax.set_title(f"{MODE_TITLES[mode]}: loss by position, N = {top}"
                     + ("\n(each position from the shortest N reaching it)" if joined else
                        "" if mode == "nonoverlapping" else
                        f"\n(stride {positions['stride']}: each N's scored tokens, N − {positions['stride'] - 1}..N)"),
                     fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    _legend(fig, axes, layout)
    fig.tight_layout()
    savefig(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)
