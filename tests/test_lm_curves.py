"""``fairseq-pe-lm-curves`` (fairseq_pe/lm/curves.py): validation loss against tokens seen, from fairseq-train's logs
(the pilot of docs/lm.md)."""

import json

import pytest

from fairseq_pe.errors import UserError
from fairseq_pe.lm import curves
from helpers import cli

LOG = """\
2026-12-06 09:17:19 | INFO | train_inner | epoch 001:    100 / 2278 loss=11.1, ppl=2213.45, wps=15223.7, ups=7.43, wpb=2048, bsz=32, num_updates=100, lr=0.001, gnorm=0.6, train_wall=13, wall=15
2026-12-06 09:17:32 | INFO | train_inner | epoch 001:    200 / 2278 loss=9.3, ppl=635.15, wps=15234.9, ups=7.44, wpb=1000, bsz=32, num_updates=200, lr=0.002, gnorm=0.2, train_wall=13, wall=28
2026-12-06 09:17:41 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {a} | ppl 393.61 | wps 44275.5 | wpb 1942.7 | bsz 30.4 | num_updates 250
2026-12-06 09:17:41 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {a} | ppl 393.61 | wps 44275.5 | wpb 1942.7 | bsz 30.4 | num_updates 250 | best_loss {a}
2026-12-06 09:17:45 | INFO | train_inner | epoch 001:    300 / 2278 loss=9.0, ppl=600, wps=15234.9, ups=7.44, wpb=500, bsz=32, num_updates=300, lr=0.002, gnorm=0.2, train_wall=13, wall=40
2026-12-06 09:18:41 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {b} | ppl 213.17 | wps 22296.9 | wpb 1942.7 | bsz 30.4 | num_updates 400
2026-12-06 09:18:42 | INFO | fairseq_cli.train | done training in 61.5 seconds
"""


def test_tokens_seen_follow_each_interval_rate_and_a_repeated_validation_counts_once():
    """Tokens: 100 updates at 2048, 100 at 1000, then 500 a batch (250 updates: 204,800 + 50,000 × ... ); the
    validation fairseq prints twice at update 250 is one point (catches: the last wpb for every update, the
    first line's rate after it, or a list of points keeping the repeat)."""
    parsed = curves.parse_log(LOG.format(a="8.5", b="7.25"), "test")
    assert [p["updates"] for p in parsed["points"]] == [250, 400]
    assert parsed["points"][0]["tokens"] == 100 * 2048 + 100 * 1000 + 50 * 500
    assert parsed["points"][1]["tokens"] == 100 * 2048 + 100 * 1000 + 200 * 500
    assert [p["loss"] for p in parsed["points"]] == [8.5, 7.25]
    assert parsed["seconds"] == 61.5 and parsed["subset"] == "valid"


def test_differences_pair_runs_of_one_size_at_one_update():
    report = {"tiny/none": curves.parse_log(LOG.format(a="8.5", b="7.25"), "a"),
              "tiny/alibi": curves.parse_log(LOG.format(a="8.25", b="7.0"), "b"),
              "small/alibi": curves.parse_log(LOG.format(a="1.0", b="1.0"), "c")}
    diff = curves.differences(report, "none")
    assert diff == {"tiny/alibi": {"250": -0.25, "400": -0.25}}  # small has no reference: no row


def test_a_log_without_validation_is_refused_by_name(tmp_path):
    with pytest.raises(UserError, match="--validate-interval-updates"):
        curves.parse_log(LOG.split("\n")[0] + "\n", "--run x=log")


def test_the_command_writes_its_table_json_and_picture(tmp_path):
    logs = {}
    for name, (a, b) in {"none": ("8.5", "7.25"), "alibi": ("8.25", "7.0")}.items():
        logs[name] = tmp_path / f"{name}.log"
        logs[name].write_text(LOG.format(a=a, b=b))
    out = tmp_path / "out"
    proc = cli("fairseq-pe-lm-curves", "--run", f"tiny/none={logs['none']}", f"tiny/alibi={logs['alibi']}",
               "--reference", "none", "--out", str(out))
    report = json.loads((out / "curves.json").read_text())
    assert report["differences"]["tiny/alibi"] == {"250": -0.25, "400": -0.25}
    assert (out / "curves.png").stat().st_size > 0 and "| tiny/alibi | -0.250 | -0.250 |" in proc.stdout
    again = cli("fairseq-pe-lm-curves", "--run", f"tiny/none={logs['none']}", "--out", str(out), check=False)
    assert again.returncode == 2 and "--force" in again.stderr  # never over an earlier result unasked
    bad = cli("fairseq-pe-lm-curves", "--run", f"tiny/none={logs['none']}", "--reference", "rope", "--out",
              str(tmp_path / "o2"), check=False)
    assert bad.returncode == 2 and "--reference rope: no run of that system" in bad.stderr
