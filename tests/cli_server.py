"""A fork server for the tests' console-script runs: ``helpers.cli`` runs every ``fairseq-*`` console script of this
environment as a child forked from one long-lived process that has imported torch and fairseq once, instead of a new
interpreter that imports them again (6-7 s of CPU each time, most of a tiny model's run).

Each run is still a process of its own: a fresh ``fork()`` with its own argv, environment, working directory, stdin
(/dev/null), stdout and stderr (files, read back by the caller), calling the entry point that the console script
calls, and exiting with the status the script would exit with (``SystemExit``'s code, 1 and the traceback on an
uncaught exception).  The server imports nothing of fairseq-pe, so ``--user-dir`` and the plugin's registrations
happen in each run as they do from a shell.  A script that configures logging before it imports fairseq
(``fairseq-train``) starts from a new interpreter's root logger; every other keeps it as fairseq's import left it, as
it would be in its own interpreter (fairseq-generate, the plugin's tools: they import fairseq before they configure
logging, or configure it with ``force=True``).  What a script does before its entry point (its interpreter's start-up:
``PYTHON*`` variables, ``-W`` flags, and what torch reads at import: ``helpers.READ_AT_START``) is the server's;
``helpers.cli`` starts it with the environment every run gets, and gives a run whose values of those differ a new
interpreter.  Three differences remain (``tests/test_cli_server.py`` checks the rest): the installed wrapper never
runs; fairseq is imported already, so a ``fairseq-pe-*`` tool registers the plugin at once, not through its post-import
hook (``fairseq_pe/__init__.py``); and what fairseq logs at its import ("Please install tensorboardX") is logged once,
by the server.  The tests of ``fresh_subset.py`` cover them: every console script runs once per run of the suite
through its wrapper in a new interpreter.  A server that imported only fairseq's dependencies would remove the last
two at 1.3 s of CPU per run instead of 0.05-0.16 s (``fairseq-train --help``, ``fairseq-pe-warm-start-floater
--help``; a new interpreter: 7 s), some 7 minutes of CPU over the suite.
``FAIRSEQ_PE_TEST_FORK=0`` makes ``helpers.cli`` start a new interpreter per run instead.

``python SCRIPT ARGS`` with this interpreter runs the same way, SCRIPT as ``__main__`` (``runpy``).

Protocol: one JSON request per line on stdin (argv0, args, entry point or null for a script, environment, cwd, stdout and stderr paths),
one JSON line per request on stdout: ``{"returncode": N}``.  The server exits at end of input."""

import ast
import atexit
import importlib
import importlib.util
import json
import logging
import os
import runpy
import sys
import traceback


def _configures_logging_before_fairseq(module):
    """Whether ``module`` calls ``logging.basicConfig`` at its top level before it imports fairseq (fairseq_cli.train
    does, to log on stdout in its format).  Importing fairseq otherwise configures the root logger itself (a stderr
    handler, from a module-level ``logging.info``/``basicConfig`` of its own): the server's import did that, which
    is right for every other script; this one must start from a new interpreter's root logger."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # the run itself reports it, as its script would
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(n == "fairseq" or n.startswith("fairseq.") for n in names):
                return False
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                ast.unparse(node.value.func) == "logging.basicConfig":
            return True
    return False


def _run_child(request):
    """In the forked child: become the console script and never return."""
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
            os.close(out)
        # in the child: find_spec imports the module's parent packages (the plugin's, for its tools)
        if request["entry"] and _configures_logging_before_fairseq(request["entry"].partition(":")[0]):
            root = logging.getLogger()
            for handler in list(root.handlers):
                root.removeHandler(handler)
            root.setLevel(logging.WARNING)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["argv0"], *request["args"]]
        sys.path[0] = os.path.dirname(request["argv0"])  # as the script's own interpreter has it
        if request["entry"] is None:  # ``python SCRIPT ARGS``: the script as __main__
            def func():
                runpy.run_path(request["argv0"], run_name="__main__")
        else:
            module, _, attr = request["entry"].partition(":")
            func = importlib.import_module(module)
            for name in attr.split("."):
                func = getattr(func, name)
        try:
            result = func()
            code = 0 if result is None else result
        except SystemExit as e:  # as the interpreter treats it
            code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        code = 1
        try:
            sys.excepthook(*sys.exc_info())
        except SystemExit as e:  # a hook that ends the process with a status, as the interpreter honours it
            code = e.code if isinstance(e.code, int) else 1
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        traceback.print_exc()
    os._exit(code & 0xFF if code >= 0 else 1)


def main():
    import torch  # noqa: F401  (what every run imports; imported once, here)
    import fairseq  # noqa: F401
    import fairseq.checkpoint_utils  # noqa: F401
    import fairseq.options  # noqa: F401
    import fairseq.trainer  # noqa: F401
    # torch.optim's first Optimizer imports torch._dynamo (2 s of CPU in every forked fairseq-train otherwise); it
    # starts no thread, so forking stays safe
    import torch._dynamo  # noqa: F401

    protocol = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_child(request)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)  # -N for a signal, as subprocess reports it
        protocol.write(json.dumps({"returncode": code}) + "\n")
        protocol.flush()


if __name__ == "__main__":
    main()
