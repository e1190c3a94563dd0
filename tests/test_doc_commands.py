"""Every command shown in the documentation (README.md, docs/**/*.md) still runs as written: its
program exists and accepts every flag the doc passes, so that a renamed or removed flag cannot leave
a stale doc.  tests/doc_commands.py extracts the commands (its docstring: the doc notation) and checks:

* fairseq-pe-* tools (setup.py's console scripts), ``python -m fairseq_pe...`` and ``python
  scripts/*.py``: the parser the tool builds (taken from its main at its ``parse_args``) has every flag
  exactly (argparse would take a prefix), and parses the arguments without error (placeholders kept,
  each alternative of the notation tried); the quickstart's --systems are known names, or NAME=FLAGS
  that fairseq-train accepts;
* fairseq-train/-generate/...: fairseq's own parsers, in-process, ``--user-dir`` (which must be the
  plugin folder) imported first as the console scripts do; a command that uses an arch, task or
  criterion of the plugin must have ``--user-dir fairseq_pe``;
* bash scripts (scripts/, data-prep/): the file exists (executable when run without bash); the
  environment variables given to it (``SEEDS=... bash ...``, or ``NAME=`` in the comment of its line)
  are read by it or by the scripts it runs; its flags reach a tool that accepts them (the ``"$@"`` it
  passes on, script to script, as doc_commands.FORWARDS says and the scripts are checked to do) or are
  in the script itself; a script with DRY_RUN=1 runs so;
* torchrun's own options, against torch's parser; any other program must be in FOREIGN;
* the commands of our programs written in the prose as `code spans` (often fragments: only that the
  program exists and knows every flag), and every ``--pe-*`` flag the docs name anywhere, tables
  included, against fairseq-train's options with the plugin.

Nothing is trained or read: fairseq is imported once and only parses.
"""

import os
import re

import pytest

import doc_commands as dc

COMMANDS = dc.extract_all()


@pytest.mark.parametrize("command", COMMANDS, ids=dc.command_ids(COMMANDS))
def test_doc_command(command):
    problems = dc.check(command)
    assert not problems, "\n".join(problems)


def test_the_docs_have_the_commands_this_test_checks():
    """The extractor finds the docs' commands (this test cannot pass on an empty list)."""
    programs = {c.program for c in COMMANDS}
    assert {"fairseq-train", "fairseq-generate", "fairseq-pe-bucket-bleu", "fairseq-pe-bucket-loss",
            "fairseq-pe-analyze", "fairseq-pe-quickstart"} <= programs
    assert any(p.startswith("scripts/recipes/") for p in programs)
    assert any(p.startswith("data-prep/") for p in programs)
    assert len([c for c in COMMANDS if c.kind != "foreign"]) >= 30
    # the notation is met: alternatives read several ways, environment prefixes, elided flags
    assert max(len(dc.variants(c.args)) for c in COMMANDS) >= 4
    assert any(c.env for c in COMMANDS if c.kind == "script")
    assert any(c.elided for c in COMMANDS if c.kind == "fairseq")
    # and the commands written in the prose, e.g. the analysis behind a table
    assert any(c.inline and c.program == "fairseq-pe-analyze" and "--trained-length" in c.args for c in COMMANDS)


def write_doc(tmp_path, text):
    path = tmp_path / "doc.md"
    path.write_text(text, encoding="utf-8")
    return dc.extract(str(path), "doc.md")


def test_the_notation(tmp_path):
    commands = write_doc(tmp_path, """\
# a page

```bash
SEEDS="1 2" bash scripts/recipes/s2l-cpu-en-de.sh work \\
    --extra-test a=b,c   # a comment with --no-flag
fairseq-train ... --user-dir fairseq_pe ...; fairseq-generate d --path c.pt > gen.txt
torchrun --nproc_per_node 2 $(which fairseq-train) d --arch transformer_pe_tiny
fairseq-pe-bucket-bleu --system a=b (--lengths l | --source s [--unit subword --spm-model m]) --out r
# a subset:  SYSTEMS="rope" bash scripts/recipes/s2l-cpu-captions.sh WORKDIR
pip install something
```

```
fairseq-train: error: --pe-t5-max-distance must be greater than 16
fairseq-pe-analyze CHECKPOINT [CHECKPOINT ...] --out DIR
  └─ fairseq's forward (a diagram: not shell)
```

```python
fairseq_pe.analysis.analyze("fairseq-train")
```
""")
    summary = [(c.line, c.kind, c.program) for c in commands]
    assert summary == [(4, "script", "scripts/recipes/s2l-cpu-en-de.sh"), (6, "fairseq", "fairseq-train"),
                       (6, "fairseq", "fairseq-generate"), (7, "fairseq", "fairseq-train"),
                       (8, "tool", "fairseq-pe-bucket-bleu"), (9, "script", "scripts/recipes/s2l-cpu-captions.sh"),
                       (10, "foreign", "pip"), (15, "tool", "fairseq-pe-analyze")]
    s2l, train, gen, torchrun, bleu, captions, _, analyze = commands
    assert s2l.env == {"SEEDS": "1 2"} and s2l.args == ["work", "--extra-test", "a=b,c"] and not s2l.elided
    assert train.elided and dc.variants(train.args) == [["--user-dir", "fairseq_pe"]]
    assert gen.args == ["d", "--path", "c.pt"] and not gen.elided  # the redirection is not an argument
    assert torchrun.launcher == ["--nproc_per_node", "2"] and torchrun.args[0] == "d"
    assert dc.variants(bleu.args) == [["--system", "a=b", "--lengths", "l", "--out", "r"],
                                      ["--system", "a=b", "--source", "s", "--unit", "subword", "--spm-model", "m",
                                       "--out", "r"]]
    assert captions.env == {"SYSTEMS": "rope"} and captions.args == ["WORKDIR"]
    assert dc.variants(analyze.args) == [["CHECKPOINT", "CHECKPOINT", "--out", "DIR"]] and analyze.elided
    assert dc.command_ids(commands)[1:3] == ["doc.md:6:fairseq-train", "doc.md:6:fairseq-generate"]


TORCHRUN = "torchrun {} 2 $(which fairseq-train) d --user-dir fairseq_pe --arch transformer_pe_tiny"
#: (a command the docs could show, the same with one mistake, what the check must say about it)
STALE = {
    "tool flag": ("fairseq-pe-bucket-bleu --system a=gen.txt --reference test.de --out r",
                  "fairseq-pe-bucket-bleu --system a=gen.txt --referense test.de --out r",
                  "fairseq-pe-bucket-bleu: unknown flag --referense"),
    "tool flag prefix": ("fairseq-pe-s2l-split --corpus c -s en -t de --out o --spm-vocab-size 8000",
                         "fairseq-pe-s2l-split --corpus c -s en -t de --out o --spm-vocab 8000",
                         "fairseq-pe-s2l-split: unknown flag --spm-vocab"),
    "tool alternative": ("fairseq-pe-bucket-loss d --system a=c.pt (--lengths l | --unit token) --out o",
                         "fairseq-pe-bucket-loss d --system a=c.pt (--lengths l | --unit tokens) --out o",
                         "fairseq-pe-bucket-loss [reading: d --system a=c.pt --unit tokens --out o]: argument --unit"),
    "tool missing": ("fairseq-pe-analyze CHECKPOINT --out DIR", "fairseq-pe-analyse CHECKPOINT --out DIR",
                     "fairseq-pe-analyse: no such console script in setup.py"),
    "quickstart system": ("fairseq-pe-quickstart --systems rope \"all=--pe-absolute learned --pe-all-blocks\"",
                          "fairseq-pe-quickstart --systems rope \"all=--pe-absolute learned --pe-all-block\"",
                          "--systems all=... (fairseq-train): unknown flag --pe-all-block"),
    "fairseq-train flag": ("fairseq-train d --user-dir fairseq_pe --arch transformer_pe_tiny --pe-relative rope ...",
                           "fairseq-train d --user-dir fairseq_pe --arch transformer_pe_tiny --pe-relativ rope ...",
                           "fairseq-train: unknown flag --pe-relativ"),
    "fairseq-train value": ("fairseq-train d --user-dir fairseq_pe --arch roberta_pe_tiny --task span_prediction",
                            "fairseq-train d --user-dir fairseq_pe --arch roberta_pe_tiny --task span_predict",
                            "fairseq-train: argument --task: invalid choice: 'span_predict'"),
    "fairseq-train without --user-dir": ("fairseq-train d --user-dir fairseq_pe --arch transformer_pe_tiny",
                                         "fairseq-train d --arch transformer_pe_tiny",
                                         "--arch transformer_pe_tiny comes from fairseq_pe"),
    "fairseq-generate flag": ("fairseq-generate d --user-dir fairseq_pe --path c.pt --beam 4",
                              "fairseq-generate d --user-dir fairseq_pe --path c.pt --beams 4",
                              "fairseq-generate: unknown flag --beams"),
    "torchrun": (TORCHRUN.format("--nproc_per_node"), TORCHRUN.format("--nproc_per_nod"),
                 "torchrun: unknown flag --nproc_per_nod"),
    "script flag": ("bash scripts/quickstart.sh --seeds 1 2 3", "bash scripts/quickstart.sh --seed 1 2 3",
                    "scripts/quickstart.sh -> fairseq-pe-quickstart: unknown flag --seed"),
    "script to script flag": ("bash scripts/recipes/s2l-cpu-captions.sh w --extra-test a=b,c",
                              "bash scripts/recipes/s2l-cpu-captions.sh w --extra-tests a=b,c",
                              "s2l-cpu-captions.sh -> fairseq-pe-quickstart: unknown flag --extra-tests"),
    "data-prep flag": ("data-prep/prepare-mono.sh --input x --destdir y --vocab-size 8000",
                       "data-prep/prepare-mono.sh --input x --destdir y --vocab 8000",
                       "data-prep/prepare-mono.sh -> fairseq-pe-prepare-mono: unknown flag --vocab"),
    "script own flag": ("bash scripts/install.sh", "bash scripts/install.sh --force",
                        "scripts/install.sh: unknown flag --force"),
    "script missing": ("bash scripts/recipes/s2l-cpu-en-de.sh w", "bash scripts/recipes/s2l-cpu-de-en.sh w",
                       "scripts/recipes/s2l-cpu-de-en.sh: no such script"),
    "script variable": ("SEEDS=\"1 2\" bash scripts/recipes/s2l-cpu-en-de.sh w",
                        "SEED=\"1 2\" bash scripts/recipes/s2l-cpu-en-de.sh w",
                        "environment variable SEED is not read by scripts/recipes/s2l-cpu-en-de.sh"),
    "script variable value": ("SYSTEMS=\"rope fire\" bash scripts/recipes/s2l-cpu-captions.sh w",
                              "SYSTEMS=\"rope fires\" bash scripts/recipes/s2l-cpu-captions.sh w",
                              "--systems: unknown system 'fires'"),
    "script variable in a comment": ("scripts/recipes/bert-cpu.sh   # JOBS=2: two at a time",
                                     "scripts/recipes/bert-cpu.sh   # NJOBS=2: two at a time",
                                     "environment variable NJOBS is not read"),
    "script dry run": ("FINETUNE=sst2 scripts/recipes/bert-cpu.sh", "FINETUNE=glue scripts/recipes/bert-cpu.sh",
                       "DRY_RUN=1 fails (exit 2): bert-cpu.sh: unknown fine-tuning 'glue'"),
    "python script flag": ("python scripts/warm_start_floater.py a.pt b.pt --tolerance 1e-4",
                           "python scripts/warm_start_floater.py a.pt b.pt --tol 1e-4",
                           "scripts/warm_start_floater.py: unknown flag --tol"),
    "module flag": ("python -m fairseq_pe.translation.quickstart --seeds 1",
                    "python -m fairseq_pe.translation.quickstart --seed 1",
                    "fairseq_pe.translation.quickstart: unknown flag --seed"),
    "module missing": ("python -m fairseq_pe.translation.quickstart --seeds 1",
                       "python -m fairseq_pe.translation.quickstarts",
                       "fairseq_pe.translation.quickstarts: no such module"),
    "foreign program": ("pip install fairseq-pe", "sacrebleu ref.txt < hyp.txt",
                        "sacrebleu: unknown program"),
}


@pytest.mark.parametrize("case", list(STALE))
def test_a_stale_command_is_reported_with_its_line_and_flag(tmp_path, case):
    good, bad, expected = STALE[case]
    commands = write_doc(tmp_path, f"Text.\n\n```bash\n{good}\n{bad}\n```\n")
    assert [c.line for c in commands] == [4, 5]
    assert dc.check(commands[0]) == []
    problems = dc.check(commands[1])
    assert problems and all(p.startswith("doc.md:5: ") for p in problems), problems
    assert any(expected in p for p in problems), problems


def test_a_renamed_flag_in_the_real_docs_is_found(tmp_path):
    """The same check on the docs themselves: rename a flag of one of their commands and it fails."""
    analyze = next(c for c in COMMANDS if c.program == "fairseq-pe-analyze" and "--out" in c.args)
    renamed = dc.Command(**{**vars(analyze), "args": ["--output" if a == "--out" else a for a in analyze.args]})
    assert f"{analyze.where}: fairseq-pe-analyze: unknown flag --output" in dc.check(renamed)


@pytest.mark.parametrize("script", list(dc.FORWARDS))
def test_the_scripts_pass_their_arguments_where_forwards_says(script):
    """FORWARDS against the scripts: a line passes ``"$@"`` to the tool (its console script or module)
    or script named there, and the script reads positional words itself ($1, shift) when it says so."""
    receiver, positional = dc.FORWARDS[script]
    names = {receiver, os.path.basename(receiver), *dc.entry_points().get(receiver, ())[:1]}
    lines = dc.script_code(script).splitlines()
    assert any('"$@"' in line and any(n in line.split('"$@"')[0] for n in names) for line in lines), (script, names)
    assert bool(re.search(r"\bshift\b|\$\{?1\b", dc.script_code(script))) == positional


def top_level_lines(script):
    """The lines of a script outside its functions' bodies (there ``"$@"`` is the function's)."""
    body = False
    for line in dc.script_code(script).splitlines():
        opens = re.match(r"(function\s+)?[\w:-]+\s*\(\)", line)  # name() { ... (one line: name() { ...; })
        if not (opens or body):
            yield line
        body = not line.rstrip().endswith("}") if opens else body and line.strip() != "}"


def test_every_script_the_docs_run_that_passes_its_arguments_on_is_in_forwards():
    """A script not in FORWARDS has its flags looked up in its own text: none passes its ``"$@"`` to a
    tool, a fairseq console script, a module of ours or another script."""
    for script in {c.program for c in COMMANDS if c.kind == "script"} - set(dc.FORWARDS):
        passed_to = [line.split('"$@"')[0] for line in top_level_lines(script) if '"$@"' in line]
        assert not [p for p in passed_to if re.search(r"fairseq-[\w-]+|-m fairseq_pe|\.sh\b", p)], script


def test_a_wrong_flag_in_a_doc_fails_the_check(tmp_path):
    """End to end, as test_doc_command runs on the real docs: a markdown file with one command whose flag
    was renamed, in a fence and in the prose, is reported at its line; the file as it should be is not."""
    good = "fairseq-generate data-bin --user-dir fairseq_pe --path c.pt --beam 4"
    for text, line in (("# A page\n\n```bash\n{}\n```\n", 4), ("# A page\n\nRun `{}` then.\n", 3)):
        path = tmp_path / "page.md"
        path.write_text(text.format(good), encoding="utf-8")
        commands = dc.extract(str(path), "page.md") + dc.inline_commands(str(path), "page.md")
        assert len(commands) == 1 and dc.check(commands[0]) == []
        path.write_text(text.format(good.replace("--beam", "--beams")), encoding="utf-8")
        commands = dc.extract(str(path), "page.md") + dc.inline_commands(str(path), "page.md")
        assert dc.check(commands[0]) == [f"page.md:{line}: fairseq-generate: unknown flag --beams"]


def test_the_documentation_files():
    files = [os.path.relpath(p, dc.REPO) for p in dc.doc_files()]
    assert files[0] == "README.md"
    assert all(f.startswith("docs" + os.sep) and f.endswith(".md") for f in files[1:])


@pytest.mark.parametrize("path", dc.doc_files(), ids=lambda p: os.path.relpath(p, dc.REPO))
def test_every_pe_flag_the_docs_name_exists(path):
    """Every ``--pe-*`` flag named anywhere in the docs, prose and tables included, is an option of
    fairseq-train with the plugin (transformer_pe or roberta_pe)."""
    assert dc.unknown_pe_flags(path) == []


def test_commands_and_flags_in_the_prose_are_checked(tmp_path):
    path = tmp_path / "doc.md"
    path.write_text("# A page\n\nMeasured with `fairseq-pe-analyze CKPT --length 136\n--probe-lenght 136` (2 s), "
                    "see `learned.py`, fairseq's `scripts/average_checkpoints.py` and `floater-table2.sh [base]`.\n\n"
                    "| `--pe-floater-dtt` | the `--pe-floater-*` options, `--pe-floater-dt` |\n\n"
                    "```python\nx = '--pe-made-up'\n```\n", encoding="utf-8")
    commands = dc.inline_commands(str(path), "doc.md")
    assert [(c.line, c.program, c.inline) for c in commands] == [(3, "fairseq-pe-analyze", True)]
    assert dc.check(commands[0]) == ["doc.md:3: fairseq-pe-analyze: unknown flag --probe-lenght"]
    assert dc.unknown_pe_flags(str(path), "doc.md") == [
        "doc.md:6: --pe-floater-dtt: no such option of fairseq-train --user-dir fairseq_pe",
        "doc.md:9: --pe-made-up: no such option of fairseq-train --user-dir fairseq_pe"]
