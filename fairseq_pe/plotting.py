"""Plots shared by every tool: matplotlib on the Agg backend, and one style per system.

:func:`system_styles` gives each system of a plot its own colour and marker, the colours grouped by
family so that a reader finds an encoding's relatives at a glance:

======== =========================================================== ==========
family   systems (quickstart names; anything containing them)         colours
======== =========================================================== ==========
control  ``none``                                                     black
APE      ``ape-*``                                                    blues
RPE      ``rpe-*``, combinations (``ape-sin+rpe-learned``), ``cope`` greens
rotary   ``rope*``, ``p-rope``, ``xpos``, ``fope``                    purples
bias     ``alibi`` ``t5`` ``kerple-*`` ``sandwich`` ``fire`` ``fox`` reds
FLOATER  ``floater*``                                                 oranges
other    any other name                                               a qualitative palette
======== =========================================================== ==========

Within a family the shades are spread over the colour map and the members take the line styles in turn
(solid, dashed, dotted, dash-dot), so that five shades of red read apart in a plot of lines without markers
(the loss-by-position plot).  Markers are never reused within one plot up to :data:`MARKERS` systems (21), and
beyond that a (marker, line style) pair is never reused.  matplotlib's
default cycle repeats its 10 colours from the 11th system, which gave ``none`` and ``floater`` one colour.
"""

import re
from typing import Dict, List, Sequence

FAMILIES = ("control", "APE", "RPE", "rotary", "bias", "FLOATER", "other")
#: matplotlib colour map per family (sequential maps: one hue, shades spread between SHADES)
COLOUR_MAPS = {"APE": "Blues", "RPE": "Greens", "rotary": "Purples", "bias": "Reds", "FLOATER": "Oranges"}
SHADES = (0.45, 0.95)
#: markers that read apart at 6 px, filled ones first
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "p", "h", "<", ">", "d", "H", "8", "1", "2", "3", "4", "+", "x")
LINESTYLES = ("-", "--", ":", "-.")

_BIAS = re.compile(r"\b(alibi|t5|kerple[-\w]*|sandwich|fire|fox)\b")


def family(name: str) -> str:
    """The family of a system's name (see the module's table)."""
    n = name.lower()
    if "floater" in n:
        return "FLOATER"
    if "rpe" in n or re.search(r"\bcope\b", n):  # rpe-*, combinations with an RPE, CoPE (q·e[p], Shaw-like)
        return "RPE"
    if n.startswith("ape") or re.search(r"\bape-", n):
        return "APE"
    if n.startswith(("rope", "xpos", "fope")) or re.search(r"\b(rope|xpos|fope)\b", n):
        return "rotary"
    if _BIAS.search(n):
        return "bias"
    if re.match(r"none\b", n):
        return "control"
    return "other"


def system_styles(names: Sequence[str]) -> Dict[str, dict]:
    """``{name: {"color", "marker", "linestyle"}}`` for the systems of one plot, in their order; every
    colour differs from every other, and so does every marker (up to len(MARKERS) systems)."""
    import matplotlib

    names = list(dict.fromkeys(names))
    members: Dict[str, List[str]] = {}
    for name in names:
        members.setdefault(family(name), []).append(name)
    colours = {}
    for fam, group in members.items():
        if fam == "control":
            palette = [(0.0, 0.0, 0.0, 1.0), (0.45, 0.45, 0.45, 1.0), (0.7, 0.7, 0.7, 1.0)]
            for i, name in enumerate(group):
                colours[name] = palette[i % len(palette)] if i < len(palette) else _grey(i, len(group))
        elif fam == "other":
            cmap = matplotlib.colormaps["tab10" if len(group) <= 10 else "tab20"]
            for i, name in enumerate(group):
                colours[name] = cmap(i % cmap.N) if i < cmap.N else _grey(i, len(group))
        else:
            cmap = matplotlib.colormaps[COLOUR_MAPS[fam]]
            lo, hi = SHADES
            for i, name in enumerate(group):
                colours[name] = cmap(hi if len(group) == 1 else hi - (hi - lo) * i / (len(group) - 1))
    rank = {name: i for group in members.values() for i, name in enumerate(group)}
    styles, used = {}, set()
    for i, name in enumerate(names):
        linestyle = LINESTYLES[rank[name] % len(LINESTYLES)]
        free = [MARKERS[(i + k) % len(MARKERS)] for k in range(len(MARKERS))
                if (MARKERS[(i + k) % len(MARKERS)], linestyle) not in used]
        marker = free[0] if free else MARKERS[i % len(MARKERS)]
        used.add((marker, linestyle))
        styles[name] = {"color": tuple(float(c) for c in colours[name]), "marker": marker, "linestyle": linestyle}
    return styles


def _grey(i: int, n: int):
    level = 0.15 + 0.6 * i / max(1, n - 1)
    return (level, level, level, 1.0)


def pyplot():
    """matplotlib's pyplot on the Agg backend, without the DEBUG logging that importing fairseq turns on."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
