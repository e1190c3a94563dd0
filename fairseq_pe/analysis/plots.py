"""The pictures of the analysis (matplotlib, written as PNG): proximity heatmaps as in Wang et
al.'s Fig. 2 and Fig. 3, offset profiles, learned frequencies and ψ(m) (App. A.5, Fig. 6), and the
regression probe's error per position."""

import math
from typing import List, Optional, Sequence, Tuple

import torch

from fairseq_pe.plotting import pyplot, system_styles


def _save(plt, fig, path: str, title: str = ""):
    """Title (if any), tight layout, PNG at 110 dpi, figure closed."""
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _draw(ax, matrix: torch.Tensor, title: str, ticks: Optional[Tuple[int, int]] = None):
    """``ticks``: the (first, last) label of the rows/columns (relative distances start below 0)."""
    import numpy as np

    m = matrix.detach().double().numpy()
    first, last = ticks if ticks is not None else (0, m.shape[0] - 1)
    # colours span the 1st..99th percentile, so that one outlying entry (e.g. position 0 of a learned
    # table) does not wash out the rest; the matrices themselves are in matrices.npz
    low, high = np.nanpercentile(m, [1, 99])  # NaN: keys a decoder's query never sees (left blank)
    if high <= low:
        low, high = np.nanmin(m), np.nanmax(m)
    image = ax.imshow(m, cmap="viridis", origin="upper", extent=(first - 0.5, last + 0.5, last + 0.5, first - 0.5),
                      interpolation="nearest", vmin=low, vmax=high)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    return image


def heatmap_grid(panels: Sequence[Tuple[str, torch.Tensor]], path: str, title: str = "",
                 ticks: Optional[Tuple[int, int]] = None, columns: int = 4, xlabel: str = "position y",
                 ylabel: str = "position x"):
    """One heatmap per (title, matrix), each with its own colour bar (brighter = larger; the colour
    scale spans the 1st to 99th percentile of the matrix)."""
    plt = pyplot()
    n = len(panels)
    cols = min(columns, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(3.3 * cols, 6.0), 3.0 * rows + 0.5), squeeze=False)
    for ax, (name, matrix) in zip(axes.flat, panels):
        image = _draw(ax, matrix, name, ticks)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=7)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def offset_profile(matrix: torch.Tensor, max_offset: int) -> Tuple[List[int], List[float]]:
    """Mean over x of M[x, x+m] for m = -max_offset .. max_offset (the diagonals of M); offsets
    without entries (a decoder's future keys, NaN) are left out."""
    n = matrix.size(0)
    span = min(max_offset, n - 1)
    offsets, means = [], []
    for m in range(-span, span + 1):
        diagonal = matrix.double().diagonal(m)
        diagonal = diagonal[~diagonal.isnan()]
        if diagonal.numel():
            offsets.append(m)
            means.append(float(diagonal.mean()))
    return offsets, means


def profile_plot(curves: Sequence[Tuple[str, torch.Tensor]], path: str, max_offset: int, title: str = ""):
    """φ(x, x+m) against the offset m, averaged over x, one panel per matrix (Fig. 6 style)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.2), squeeze=False)
    for ax, (name, matrix) in zip(axes.flat, curves):
        offsets, values = offset_profile(matrix, max_offset)
        ax.plot(offsets, values, marker=".", markersize=3)
        ax.axvline(0, color="grey", linewidth=0.5)
        ax.set_xlabel("offset m", fontsize=8)
        ax.set_ylabel("mean over x of φ(x, x+m)", fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
    _save(plt, fig, path, title)


def frequency_plot(entries: Sequence[dict], path: str):
    """Learned against initial frequencies (log scale) and the ψ(m) curves they give."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.4))
    styles = system_styles([e["name"] for e in entries])
    for e in entries:  # each set against its own initial values (D differs: model or head)
        colour = styles[e["name"]]["color"]
        left.plot([abs(w) for w in e["learned"]], color=colour, label=f"{e['name']} learned")
        left.plot(e["initial"], color=colour, linestyle="--", linewidth=0.8, label=f"{e['name']} initial")
        right.plot(e["psi_learned"], color=colour,
                   label=f"{e['name']} learned (decreasing to m={e['psi_window_learned']})")
        right.plot(e["psi_initial"], color=colour, linestyle="--", linewidth=0.8,
                   label=f"{e['name']} initial (decreasing to m={e['psi_window_initial']})")
    left.set_yscale("log")
    left.set_xlabel("i", fontsize=8)
    left.set_ylabel("|ω_i| (cos is even: ψ ignores the sign)", fontsize=8)
    left.set_title("frequencies", fontsize=9)
    right.set_xlabel("offset m", fontsize=8)
    right.set_ylabel("ψ(m) = Σ cos(ω_i m)", fontsize=8)
    right.set_title("ψ(m)", fontsize=9)
    for ax in (left, right):
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def probe_plot(curves: Sequence[Tuple[str, List[int], List[float]]], path: str):
    """Absolute error of the regression probe at each held-out (odd) position."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    styles = system_styles([name for name, _, _ in curves])
    for name, positions, errors in curves:
        ax.plot(positions, errors, label=name, linewidth=1, color=styles[name]["color"])
    ax.set_xlabel("position (odd positions, held out)", fontsize=8)
    ax.set_ylabel("|predicted − true position|", fontsize=8)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    ax.set_title("linear regression probe, trained on even positions", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def norm_plot(norms: Sequence[Tuple[str, List[float]]], logit_max: List[float], path: str,
              trained_length: Optional[int] = None, title: str = ""):
    """Two panels against position, log scale: ‖p_i‖ of each block's absolute vectors (none: the panel
    says so), and the largest |identical-word logit| among positions 0..i (none, a position table's:
    the panel says so); the trained length is a dashed line when known."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    styles = system_styles([name for name, _ in norms])
    for name, values in norms:
        ax1.plot(range(len(values)), values, label=name, linewidth=1, color=styles[name]["color"])
    if norms:
        ax1.set_yscale("log")
        ax1.legend(fontsize=7, ncol=2)
    else:
        ax1.text(0.5, 0.5, "no absolute position vectors or FLOATER biases", ha="center", va="center", transform=ax1.transAxes)
    ax1.set_title("‖p_i‖ of the absolute position vectors (FLOATER: and Q/K/V biases)", fontsize=9)
    if logit_max:
        ax2.plot(range(len(logit_max)), logit_max, color="black", linewidth=1)
        ax2.set_yscale("log")
    else:
        ax2.text(0.5, 0.5, "no identical-word logits (a position table only)", ha="center", va="center",
                 transform=ax2.transAxes)
    ax2.set_title("largest |identical-word logit| among positions 0..i (first layer)", fontsize=9)
    for ax in (ax1, ax2):
        _position_axis(ax, trained_length)
    if trained_length:
        ax2.legend(fontsize=7)
    _save(plt, fig, path, title)


def norm_comparison_plot(curves: Sequence[Tuple[str, List[float], List[float]]], path: str,
                         trained_length: Optional[int] = None, title: str = ""):
    """One line per checkpoint, log scale, against position: the largest ‖state‖ over its blocks (absolute
    vectors, FLOATER biases), and the largest |identical-word logit| among positions 0..i (position
    tables have none)."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    styles = system_styles([name for name, _, _ in curves])
    for name, norms, logits in curves:
        style = {"color": styles[name]["color"], "linestyle": styles[name]["linestyle"]}
        if norms:
            ax1.plot(range(len(norms)), norms, label=name, linewidth=1, **style)
        if logits:
            ax2.plot(range(len(logits)), logits, label=name, linewidth=1, **style)
    if not any(logits for _, _, logits in curves):
        ax2.text(0.5, 0.5, "no identical-word logits (position tables only)", ha="center", va="center",
                 transform=ax2.transAxes)
    ax1.set_title("largest ‖p_i‖ over blocks (absolute vectors, FLOATER biases)", fontsize=9)
    ax2.set_title("largest |identical-word logit| among positions 0..i (first layer)", fontsize=9)
    for ax in (ax1, ax2):
        ax.set_yscale("log")
        _position_axis(ax, trained_length)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    _save(plt, fig, path, title)


def _position_axis(ax, trained_length: Optional[int]):
    """x axis "position i", a grid, and the trained length as a dashed line when known."""
    ax.set_xlabel("position i")
    ax.grid(alpha=0.3)
    if trained_length:
        ax.axvline(trained_length - 0.5, color="grey", linestyle="--", linewidth=0.8,
                   label=f"trained length ({trained_length})")
