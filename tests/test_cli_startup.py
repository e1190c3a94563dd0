"""The fairseq-pe-* tools that do not need fairseq (bucket BLEU, the S2L split, the data preparation,
GLUE/SQuAD scoring, the quickstart's own options) print --help and report a bad argument without
importing fairseq or torch, so that they start at once (fairseq_pe/__init__.py registers the plugin
only when fairseq is imported); so do the measurements' tools (fairseq_pe/benchmark/), whose scripts of before
still run them, with a deprecation line.  Their time is measured by scripts/benchmark_startup.py, not here."""

import json
import os
import subprocess
import sys

import pytest

#: tools whose --help and argument errors must not import fairseq or torch
LIGHT = ["fairseq-pe-quickstart", "fairseq-pe-s2l-split", "fairseq-pe-bucket-bleu", "fairseq-pe-bucket-loss",
         "fairseq-pe-prepare-wmt14", "fairseq-pe-prepare-mono", "fairseq-pe-prepare-glue",
         "fairseq-pe-prepare-squad", "fairseq-pe-glue-eval", "fairseq-pe-squad-predict",
         "fairseq-pe-average-checkpoints", "fairseq-pe-benchmark", "fairseq-pe-gpu-check", "fairseq-pe-count-ops",
         "fairseq-pe-sdpa-arguments"]
HEAVY = ("fairseq", "torch")

PROBE = """
import json, sys
from importlib.metadata import entry_points
tool, argv = sys.argv[1], sys.argv[2:]
main = next(e for e in entry_points(group="console_scripts") if e.name == tool).load()
sys.argv = [tool] + argv
try:
    main()
    status = 0
except SystemExit as exc:
    status = exc.code
print(json.dumps({"status": status, "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def probe(tool, *argv):
    out = subprocess.run([sys.executable, "-c", PROBE, tool, *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.parametrize("tool", LIGHT)
def test_help_and_a_bad_argument_do_not_import_fairseq_or_torch(tool):
    result, _ = probe(tool, "--help")
    assert result == {"status": 0, "heavy": []}
    result, err = probe(tool, "--no-such-option")
    assert result == {"status": 2, "heavy": []}
    assert f"{tool}: error:" in err


def test_the_plugin_registers_itself_when_fairseq_is_imported_later():
    code = ("import sys, fairseq_pe; assert 'fairseq' not in sys.modules; "
            "from fairseq.models import ARCH_MODEL_REGISTRY; from fairseq.tasks import TASK_REGISTRY; "
            "print('transformer_pe' in ARCH_MODEL_REGISTRY, 'roberta_pe' in ARCH_MODEL_REGISTRY, "
            "'span_prediction' in TASK_REGISTRY)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"]


def test_the_probe_sees_a_tool_that_imports_fairseq():
    """The check above can fail: fairseq-pe-warm-start-floater needs fairseq and imports it."""
    result, _ = probe("fairseq-pe-warm-start-floater", "--help")
    assert result["status"] == 0 and "fairseq" in result["heavy"]


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the scripts that became console scripts of fairseq_pe/benchmark/: each old path runs its tool for one more release
MOVED = {"scripts/benchmark_positions.py": "fairseq-pe-benchmark", "scripts/gpu_check.py": "fairseq-pe-gpu-check",
         "scripts/count_ops.py": "fairseq-pe-count-ops", "scripts/sdpa_arguments.py": "fairseq-pe-sdpa-arguments"}


@pytest.mark.parametrize("script", sorted(MOVED))
def test_a_moved_script_runs_its_console_script_after_a_deprecation_line(script):
    """``python scripts/X.py ARGS`` is ``TOOL ARGS`` (its installed wrapper) with one more line on stderr, which names
    the tool: its --help, and its error for a bad argument."""
    tool = MOVED[script]
    deprecation = f"{script} is deprecated: run {tool} (the same options); this path goes in the next release"
    runs = {}
    for name, cmd in (("script", [sys.executable, os.path.join(REPO, script)]),
                      ("tool", [os.path.join(os.path.dirname(sys.executable), tool)])):
        runs[name] = [subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=120)
                      for argv in (["--help"], ["--no-such-option"])]
    for name, (help_, error) in runs.items():
        assert help_.returncode == 0 and help_.stdout.startswith(f"usage: {tool} "), help_.stderr
        assert error.returncode == 2 and error.stderr.splitlines()[-1] == \
            f"{tool}: error: unrecognized arguments: --no-such-option", error.stderr
        assert [line for proc in (help_, error) for line in proc.stderr.splitlines() if "deprecated" in line] == \
            ([deprecation] * 2 if name == "script" else [])
    assert runs["script"][0].stdout == runs["tool"][0].stdout
