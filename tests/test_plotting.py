"""Every system of a plot gets its own colour and marker, grouped by family (issue: the quickstart plot gave
none and floater one blue), and the plots use them."""

import itertools

import pytest

from fairseq_pe.plotting import MARKERS, family, system_styles
from fairseq_pe import systems as catalogue
from fairseq_pe.translation.quickstart import NAMED_SYSTEMS

#: the captions comparison's systems and variants (23), more than matplotlib's cycle and than tab20
CAPTIONS = list(catalogue.GROUPS["s2l-cpu-captions"]) + ["rope-pi", "rope-ntk", "rope-yarn"]
#: the comparison of the encodings of 2024-2025 and its decoding variants of RoPE
CAPTIONS_2024 = list(catalogue.GROUPS["s2l-cpu-captions-2024"]) + ["rope-yarn", "rope-yarn-resonance", "rope-rerope",
                                                                   "rope-leaky-rerope"]


def distance(a, b):
    return sum((x - y) ** 2 for x, y in zip(a[:3], b[:3])) ** 0.5


def test_families_of_the_named_systems():
    expected = {"none": "control", "ape-learned": "APE", "ape-sinusoidal-random": "APE", "rpe-sinusoidal": "RPE",
                "ape-sin+rpe-learned": "RPE", "rope": "rotary", "xpos": "rotary", "rope-yarn": "rotary",
                "alibi": "bias", "t5": "bias", "kerple-power": "bias", "sandwich": "bias", "fire": "bias",
                "floater": "FLOATER", "floater-bias": "FLOATER", "floater, paper's h": "FLOATER", "baseline": "other"}
    assert {name: family(name) for name in expected} == expected
    assert all(family(name) != "other" for name in NAMED_SYSTEMS), [n for n in NAMED_SYSTEMS if family(n) == "other"]


@pytest.mark.parametrize("names", [CAPTIONS, CAPTIONS_2024, list(NAMED_SYSTEMS), [f"system {i}" for i in range(20)]],
                         ids=["captions-23", "captions-2024", "named-systems", "20-unknown-names"])
def test_every_system_has_its_own_colour_and_marker(names):
    styles = system_styles(names)
    assert list(styles) == names
    for a, b in itertools.combinations(names, 2):
        assert distance(styles[a]["color"], styles[b]["color"]) > 0.04, (a, b, styles[a], styles[b])
    shown = [(s["marker"], s["linestyle"]) for s in styles.values()]
    assert len(set(shown)) == len(shown)
    if len(names) <= len(MARKERS):
        assert len({s["marker"] for s in styles.values()}) == len(names)


def test_a_family_shares_a_hue():
    styles = system_styles(CAPTIONS)
    blue = [styles[n]["color"] for n in CAPTIONS if family(n) == "APE"]
    red = [styles[n]["color"] for n in CAPTIONS if family(n) == "bias"]
    assert all(c[2] > c[0] for c in blue) and all(c[0] > c[2] for c in red)
    assert styles["none"]["color"][:3] == (0.0, 0.0, 0.0)
    assert styles["none"]["color"] != styles["floater"]["color"]  # the case


def test_the_members_of_a_family_take_the_line_styles_in_turn():
    """Five biases in shades of red, drawn as lines without markers (the loss-by-position plot), read apart by their
    line styles: the first four differ, and no (marker, line style) pair repeats.  Catches a line style taken from
    the system's place in the plot (every system solid up to 21), which left five reds hard to tell apart."""
    names = list(catalogue.group("lm-context"))  # the nine systems of issue 58's figures
    styles = system_styles(names)
    reds = [styles[n]["linestyle"] for n in names if family(n) == "bias"]
    assert len(reds) == 5 and len(set(reds[:4])) == 4
    assert styles["none"]["linestyle"] == styles["rope"]["linestyle"] == "-"  # a family's first member is solid
    many = system_styles([f"alibi-{i}" for i in range(30)])  # one family past len(MARKERS)
    pairs = [(s["marker"], s["linestyle"]) for s in many.values()]
    assert len(set(pairs)) == len(pairs)


def test_the_bleu_plot_draws_each_system_in_its_style(tmp_path, monkeypatch):
    from fairseq_pe.plotting import pyplot
    from fairseq_pe.translation import bucket_bleu
    from fairseq_pe.translation.bleu import parse_buckets

    plt = pyplot()
    drawn = {}
    real_close = plt.close

    def keep(fig):
        for handle, label in zip(*fig.axes[0].get_legend_handles_labels()):
            line = handle.lines[0]  # an errorbar's data line
            drawn[label] = (tuple(float(c) for c in line.get_color()), line.get_marker())
        real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    buckets = parse_buckets("1,5,10+")
    labels = ["[1,5)", "[5,10)", "[10,inf)", "all"]
    results = {name: {lab: {"bleu": 10.0 + i, "ratio": 1.0, "n": 3} for lab in labels}
               for i, name in enumerate(CAPTIONS)}
    bucket_bleu.plot(results, buckets, str(tmp_path / "plot.png"), "test")
    styles = system_styles(CAPTIONS)
    assert (tmp_path / "plot.png").stat().st_size > 0
    assert drawn == {n: (styles[n]["color"], styles[n]["marker"]) for n in CAPTIONS}
