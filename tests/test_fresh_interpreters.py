"""Every console script runs at least once per run of the suite as a user runs it: a new interpreter through the
wrapper installed in the environment's ``bin`` (``tests/fresh_subset.py`` names the tests that do it; conftest.py runs
them that way and fails one that did not run its scripts so).  Here: the subset covers every console script of this
package and every ``fairseq-*`` script the tests or docs run, as the installed metadata lists them; nothing of the
plugin reads the environment at import (a forked run would see the server's); and the data preparation of BERT and
GLUE, which no other test runs in its body."""

import ast
import glob
import os
import re
import shutil
import sys
from importlib.metadata import distribution, entry_points

from fairseq.data import Dictionary, data_utils

import fresh_subset
from helpers import FIXTURES, REPO, cli

TESTS = os.path.join(REPO, "tests")


def installed_scripts():
    """{console script: the distribution that installs it} for the fairseq-pe and fairseq ones of this environment."""
    return {e.name: e.dist.name for e in entry_points(group="console_scripts")
            if e.name.startswith("fairseq") and e.dist is not None}


def fairseq_scripts_in_use(fairseq_scripts):
    """The fairseq scripts that a test runs (a string of its own in tests/*.py: a command's program) or the docs show;
    tests/doc_commands.py only names parsers, and the fresh subset's own files are not uses."""
    used = set()
    for path in glob.glob(os.path.join(TESTS, "*.py")):
        if os.path.basename(path) in ("doc_commands.py", "fresh_subset.py", os.path.basename(__file__)):
            continue
        with open(path, encoding="utf-8") as f:
            used |= {node.value for node in ast.walk(ast.parse(f.read()))
                     if isinstance(node, ast.Constant) and node.value in fairseq_scripts}
    for path in [os.path.join(REPO, "README.md"), *glob.glob(os.path.join(REPO, "docs", "*.md"))]:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        used |= {s for s in fairseq_scripts if re.search(rf"(?<![\w/.-]){re.escape(s)}(?![\w-])", text)}
    return used


def test_every_console_script_runs_in_a_new_interpreter_once_per_run():
    scripts = installed_scripts()
    ours = {name for name, dist in scripts.items() if dist == distribution("fairseq-pe").name}
    fairseq = {name for name, dist in scripts.items() if dist != distribution("fairseq-pe").name}
    assert ours == {name for name in scripts if name.startswith("fairseq-pe-")}, scripts
    assert len(ours) >= 14 and {"fairseq-train", "fairseq-generate"} <= fairseq  # the metadata was read
    needed = ours | fairseq_scripts_in_use(fairseq)
    assert {"fairseq-train", "fairseq-generate", "fairseq-preprocess", "fairseq-validate"} <= needed
    missing = sorted(needed - set(fresh_subset.FRESH_SUBSET))
    assert not missing, f"console scripts that no test runs in a new interpreter (tests/fresh_subset.py): {missing}"
    bin_dir = os.path.dirname(sys.executable)
    for script in fresh_subset.FRESH_SUBSET:  # each one's installed wrapper, which the fresh runs execute
        assert script in scripts and shutil.which(script, path=bin_dir) == os.path.join(bin_dir, script), script


def test_the_subset_names_tests_that_exist():
    """conftest.py also refuses a parametrisation that does not exist, wherever the file is collected."""
    for test in fresh_subset.tests():
        file, _, name = test.partition("::")
        with open(os.path.join(TESTS, file), encoding="utf-8") as f:
            functions = {n.name for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef)}
        assert name.partition("[")[0] in functions, test


def reads_at_import(source):
    """The lines of ``source`` that read the environment (``os.environ``, ``os.getenv``) when the module is imported:
    outside any function (a class body runs at import too)."""
    found = []

    def visit(node, in_function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function = True
        if not in_function and isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            found.append(node.lineno)
        if not in_function and isinstance(node, ast.Name) and node.id in ("environ", "getenv"):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, in_function)

    visit(ast.parse(source), False)
    return found


def test_the_plugin_reads_no_environment_variable_at_import():
    """A variable read at import would be the fork server's, not the run's (``FAIRSEQ_PE_TRACEBACK`` is read when an
    error is reported: errors.py); helpers.READ_AT_START lists those that torch and the interpreter read."""
    assert reads_at_import("import os\nDEBUG = os.environ.get('X')\nclass A:\n    y = os.getenv('Y')\n") == [2, 4]
    assert reads_at_import("import os\ndef f():\n    return os.environ.get('X')\ng = lambda: os.getenv('Y')\n") == []
    offenders = {}
    for path in glob.glob(os.path.join(REPO, "fairseq_pe", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            lines = reads_at_import(f.read())
        if lines:
            offenders[os.path.relpath(path, REPO)] = lines
    assert not offenders, offenders


def test_prepare_mono_then_glue_with_its_pieces(tmp_path):
    """fairseq-pe-prepare-mono (sentencepiece and fairseq-preprocess) on a chapter of Austen, then
    fairseq-pe-prepare-glue on MRPC with its pieces and dictionary: every line kept, every example binarised."""
    text = tmp_path / "persuasion.txt"
    shutil.copy(os.path.join(FIXTURES, "persuasion-chapter1.txt"), text)
    mono = tmp_path / "mono"
    out = cli("fairseq-pe-prepare-mono", "--input", str(text), "--destdir", str(mono), "--vocab-size", "300",
              "--valid-percent", "30", "--workers", "1")
    assert "dictionary of 299 pieces" in out.stdout + out.stderr
    lines = [line for line in text.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = {split: [line for line in (mono / "raw" / f"{split}.txt").read_text(encoding="utf-8").splitlines()
                    if line.strip()] for split in ("train", "valid")}
    assert len(kept["train"]) + len(kept["valid"]) == len(lines) and kept["valid"]
    dictionary = Dictionary.load(str(mono / "dict.txt"))
    encoded = (mono / "spm" / "valid").read_text(encoding="utf-8").splitlines()  # paragraphs apart by empty lines
    assert len([line for line in encoded if line.strip()]) == len(kept["valid"])
    assert len(data_utils.load_indexed_dataset(str(mono / "valid"), dictionary)) == len(encoded)

    glue = tmp_path / "glue" / "MRPC"
    glue.mkdir(parents=True)
    shutil.copy(os.path.join(FIXTURES, "glue", "MRPC", "msr_paraphrase_train.txt"), glue)
    dest = tmp_path / "glue-bin"
    cli("fairseq-pe-prepare-glue", "--glue-dir", str(glue.parent), "--tasks", "MRPC", "--spm-model",
        str(mono / "spm.model"), "--dict", str(mono / "dict.txt"), "--destdir", str(dest), "--mrpc-dev-size", "8",
        "--workers", "1")
    for split, n in (("train", 32), ("valid", 8)):  # the fixture's 40 pairs, 8 held out
        assert len((dest / "MRPC" / f"{split}.label").read_text().splitlines()) == n
        for field in ("input0", "input1"):
            pieces = Dictionary.load(str(dest / "MRPC-bin" / field / "dict.txt"))
            assert len(data_utils.load_indexed_dataset(str(dest / "MRPC-bin" / field / split), pieces)) == n
