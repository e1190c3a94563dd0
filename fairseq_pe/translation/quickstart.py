"""``fairseq-pe-quickstart``: train one tiny model per position encoding, BLEU per length bucket.

On a machine with no data and no network it builds the synthetic short-to-long task of
:mod:`fairseq_pe.translation.synthetic` (training sentences of at most 16 words, test sentences up to
48), binarises it with ``fairseq-preprocess``, trains ``transformer_pe_tiny`` once per
encoding with ``fairseq-train --user-dir fairseq_pe``, decodes the test set with
``fairseq-generate`` and prints tables of sacreBLEU, length ratio and the references'
teacher-forced loss (``fairseq-pe-bucket-loss``'s scoring) per source-length bucket, also written
as JSON and as PNG plots (``results.png``, and ``results-loss.png`` with the loss against target
position).  ``--data DIR`` uses a real corpus instead (``DIR/{train,valid,test}.{SRC,TGT}``, raw
text, one sentence per line), segmented with a sentencepiece model trained on its training split.

``--seeds 1 2 3`` trains every system once per seed (``WORK/systems/NAME/seed-S``) on the same data
and test sets, and the tables give mean ± standard deviation over the seeds; with one seed (the
default) they say so, and every BLEU has the 95% confidence interval of sacreBLEU's bootstrap
resampling (``--bootstrap``), which measures the test set's sampling, not the training run's.

Test sets are translated from their sources alone: a reference only serves scoring, so a
reference longer than a learned position table never stops a system.  Only a *source* longer
than the model's source positions cannot be translated; the scores that would need it (its
bucket and ``all``, or an ``--extra-test`` column) are then marked ``n/a`` with the reason, and
every other score of that system is kept.  A decoding that fails marks its column the same way.

The work dir is resumed: trained systems and their translations are reused.  It is recorded in
``WORK/quickstart.json`` with the options its data were built with (each system's options in
``WORK/systems/NAME/system.json``); a re-run with other options stops and names them, since
reusing would mix results of different settings: ``--force`` rebuilds and retrains, or choose
another ``--workdir``.  A folder that holds other files and was not made by the quickstart is never
used.
"""

import argparse
import ast
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_pe.translation.bleu import GenerateOutputError, bucket_label, bucketed_bleu, parse_buckets, read_generate_output
from fairseq_pe.translation.bucket_bleu import format_table, write_outputs
from fairseq_pe.errors import UserError, cli
from fairseq_pe.seeds import combine
from fairseq_pe.seeds import describe as describe_seeds
from fairseq_pe.outputs import atomic_path, same_file, train_sentencepiece, write_json, write_text

PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fairseq_pe, for --user-dir
#: what a work dir is recognised by, with the options its data were built with
WORK_MARKER = "quickstart.json"
#: the folders and files the quickstart writes in its work dir
WORK_ENTRIES = ("raw", "spm", "data-bin", "extra", "systems", "preprocess.log", "results.txt", "results.json",
                "results.png", "results-loss.png", WORK_MARKER)
#: --max-source/target-positions of fairseq-generate: the task sets no limit of its own, the model's
#: position tables (if any) are the only one
GENERATE_MAX_POSITIONS = 1_000_000

#: the encodings the quickstart compares by default: name -> extra fairseq-train flags
DEFAULT_SYSTEMS = {
    "none": ["--pe-absolute", "none"],
    "ape-learned": ["--pe-absolute", "learned"],
    "ape-sinusoidal": ["--pe-absolute", "sinusoidal"],
    "ape-learnable-sin": ["--pe-absolute", "learnable-sinusoidal"],
    "rpe-learned": ["--pe-absolute", "none", "--pe-relative", "learned"],
    "rpe-sinusoidal": ["--pe-absolute", "none", "--pe-relative", "sinusoidal"],
    "rpe-learnable-sin": ["--pe-absolute", "none", "--pe-relative", "learnable-sinusoidal"],
    "rope": ["--pe-absolute", "none", "--pe-relative", "rope"],
    "alibi": ["--pe-absolute", "none", "--pe-relative", "alibi"],
    "t5": ["--pe-absolute", "none", "--pe-relative", "t5"],
    "floater": ["--pe-absolute", "floater", "--pe-all-blocks"],
    "floater-bias": ["--pe-absolute", "sinusoidal", "--pe-floater-bias"],
    # FLOATER's own procedure (§4.4, Table 2, Fig. 2): the sinusoidal model, converted (h ≡ 0, exact) and
    # fine-tuned with the ODE biases; these are the fine-tuning flags, WARM_STARTED says the rest
    "floater-warm": ["--pe-absolute", "sinusoidal", "--pe-floater-bias"],
}

#: systems trained in two stages: name -> (the first stage's flags, its share of --max-update).  The first
#: stage's last checkpoint is converted by ``fairseq-pe-warm-start-floater`` and fine-tuned with the system's
#: flags for the rest of --max-update (a fresh optimizer, warm-up included): the same total budget
WARM_STARTED = {"floater-warm": (["--pe-absolute", "sinusoidal"], 0.5)}

#: more systems known by name (not run by default)
NAMED_SYSTEMS = {
    **DEFAULT_SYSTEMS,
    "ape-sin+rpe-learned": ["--pe-absolute", "sinusoidal", "--pe-relative", "learned"],  # Shaw et al. 2018
    "kerple-log": ["--pe-absolute", "none", "--pe-relative", "kerple-log"],  # Chi et al. 2022
    "kerple-power": ["--pe-absolute", "none", "--pe-relative", "kerple-power"],
    "xpos": ["--pe-absolute", "none", "--pe-relative", "xpos"],  # Sun et al. 2022
    "sandwich": ["--pe-absolute", "none", "--pe-relative", "sandwich"],  # Chi et al. 2023
    "fire": ["--pe-absolute", "none", "--pe-relative", "fire"],  # Li et al. 2023
    # randomised positions (Ruoss et al. 2023) from [0, 256): past the longest sentence of the quickstart's and
    # the captions recipe's tests (196 target tokens), 7x the captions' longest training target
    "ape-sinusoidal-random": ["--pe-absolute", "sinusoidal", "--pe-random-positions", "256"],
    "rope-random": ["--pe-absolute", "none", "--pe-relative", "rope", "--pe-random-positions", "256"],
}

_print_lock = threading.Lock()


def log(msg: str):
    with _print_lock:
        print(f"[quickstart {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_system(spec: str) -> (str, List[str]):
    """``NAME`` (a default system) or ``NAME=FLAGS`` (e.g. ``learned-all=--pe-absolute learned --pe-all-blocks``)."""
    if "=" in spec:
        name, flags = spec.split("=", 1)
        return name.strip(), flags.split()
    if spec not in NAMED_SYSTEMS:
        raise UserError(f"--systems: unknown system {spec!r}; use one of {sorted(NAMED_SYSTEMS)} or NAME=FLAGS")
    return spec, NAMED_SYSTEMS[spec]


def executable(name: str) -> str:
    """A console script of this Python's environment (found even when it is not on PATH)."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else name


def run(cmd: Sequence[str], log_path: str, env=None, on_line=None):
    """Run a CLI, keep its full output in ``log_path``; raise with the log's tail on failure."""
    cmd = [executable(cmd[0])] + list(cmd[1:])
    with open(log_path, "w", encoding="utf-8") as logf:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, bufsize=1)
        for line in proc.stdout:
            logf.write(line)
            logf.flush()
            if on_line is not None:
                on_line(line)
        code = proc.wait()
    if code != 0:
        with open(log_path, encoding="utf-8") as f:
            tail = "".join(f.readlines()[-25:])
        raise RuntimeError(f"command failed ({code}): {' '.join(cmd)}\n--- last lines of {log_path} ---\n{tail}")


def count_lines(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def copy_input(src: str, dst: str):
    """Copy a user's file into the work dir (atomically; nothing to do when it is that file already)."""
    if os.path.exists(dst) and same_file(src, dst):
        return
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def file_digest(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_decode_variant(spec: str) -> Tuple[str, str, dict]:
    """``NAME=BASE:OVERRIDES``: system BASE's checkpoints decoded with fairseq's ``--model-overrides``."""
    name, eq, rest = spec.partition("=")
    base, colon, literal = rest.partition(":")
    if not (eq and colon and name and base):
        raise argparse.ArgumentTypeError(f"--decode-variant {spec!r}: use NAME=BASE:OVERRIDES, e.g. "
                                         "\"rope-ntk=rope:{'pe_rope_scaling': 'ntk', 'pe_rope_scaling_factor': 4}\"")
    try:
        overrides = ast.literal_eval(literal)
    except (ValueError, SyntaxError):
        overrides = None
    if not isinstance(overrides, dict) or not overrides:
        raise argparse.ArgumentTypeError(f"--decode-variant {spec!r}: OVERRIDES must be a non-empty Python dict, "
                                         "as fairseq-generate's --model-overrides")
    return name, base, overrides


def parse_extra_test(spec: str) -> (str, str, str):
    """``NAME=SRC,REF``: an additional test corpus (raw text, line-aligned)."""
    name, sep, files = spec.partition("=")
    paths = files.split(",")
    if not sep or not name or len(paths) != 2 or not all(paths):
        raise argparse.ArgumentTypeError(f"--extra-test {spec!r}: use NAME=SOURCE_FILE,REFERENCE_FILE")
    return name, paths[0], paths[1]


def prepare_extra_tests(args) -> List[str]:
    """Copy each ``--extra-test`` into ``WORK/extra/NAME.{SRC,TGT}``; returns the prefixes."""
    prefixes = []
    for name, src, ref in args.extra_test:
        prefix = os.path.join(args.workdir, "extra", name)
        copy_input(src, f"{prefix}.{args.source_lang}")
        copy_input(ref, f"{prefix}.{args.target_lang}")
        prefixes.append(prefix)
    return prefixes


def check_extra_tests(args):
    """Every ``--extra-test`` is there, readable and line-aligned (before anything is written)."""
    for name, src, ref in args.extra_test:
        for path in (src, ref):
            if not os.path.isfile(path):
                raise UserError(f"--extra-test {name}: no such file {path}")
        try:
            a, b = count_lines(src), count_lines(ref)
        except UnicodeDecodeError as e:
            raise UserError(f"--extra-test {name}: {src} or {ref} is not UTF-8 text ({e})") from None
        if a != b:
            raise UserError(f"--extra-test {name}: {src} has {a} lines but {ref} has {b}")
        if a == 0:
            raise UserError(f"--extra-test {name}: {src} is empty")


def prepare_corpus(args) -> str:
    """Raw text of train/valid/test in ``WORK/raw``; returns that directory."""
    raw = os.path.join(args.workdir, "raw")
    if args.data:
        return args.data
    from fairseq_pe.translation.synthetic import write_corpus

    write_corpus(raw, train_size=args.train_size, test_per_bucket=args.test_per_bucket, seed=args.data_seed,
                 src=args.source_lang, tgt=args.target_lang,
                 test_buckets=[(lo, (hi or lo + 16) - 1) for lo, hi in args.buckets])
    log(f"synthetic corpus: {args.train_size} training pairs of 1-16 words, test buckets "
        f"{[bucket_label(b) for b in args.buckets]} in {raw}")
    return raw


def check_data(args):
    """``--data`` holds line-aligned ``{train,valid,test}.{SRC,TGT}`` (before anything is written)."""
    if not os.path.isdir(args.data):
        raise UserError(f"--data {args.data}: no such folder")
    for split in ("train", "valid", "test"):
        for lang in (args.source_lang, args.target_lang):
            path = os.path.join(args.data, f"{split}.{lang}")
            if not os.path.isfile(path):
                raise UserError(f"--data {args.data}: missing {path} (expected {{train,valid,test}}.{{SRC,TGT}})")
        try:
            a = count_lines(os.path.join(args.data, f"{split}.{args.source_lang}"))
            b = count_lines(os.path.join(args.data, f"{split}.{args.target_lang}"))
        except UnicodeDecodeError as e:
            raise UserError(f"--data {args.data}: {split}.* is not UTF-8 text ({e})") from None
        if a != b:
            raise UserError(f"--data {args.data}: {split}.{args.source_lang} has {a} lines but "
                            f"{split}.{args.target_lang} has {b}")
    if args.spm_model and not os.path.isfile(args.spm_model):
        raise UserError(f"--spm-model {args.spm_model}: no such file")


def segment(args, raw: str, extra: Sequence[str]) -> (str, List[str]):
    """sentencepiece for real corpora (``--spm-model`` or a joint model trained on the training split);
    identity for synthetic data.  Returns the text directory and the extra test prefixes in it."""
    if not args.data:
        return raw, list(extra)
    import sentencepiece as spm

    out = os.path.join(args.workdir, "spm")
    os.makedirs(out, exist_ok=True)
    model = os.path.join(out, "spm.model")
    if args.spm_model:
        copy_input(args.spm_model, model)
    elif not os.path.exists(model):
        log(f"training a joint sentencepiece model ({args.spm_vocab_size} pieces)")
        try:  # written atomically: a half model is never reused
            train_sentencepiece(
                os.path.join(out, "spm"),
                input=[os.path.join(raw, f"train.{lang}") for lang in (args.source_lang, args.target_lang)],
                vocab_size=args.spm_vocab_size, character_coverage=1.0, model_type="unigram",
                input_sentence_size=2_000_000, shuffle_input_sentence=True, minloglevel=2,
            )
        except RuntimeError as e:
            raise UserError(f"--spm-vocab-size {args.spm_vocab_size}: sentencepiece failed ({e}); "
                            "try a smaller size") from None
    try:
        sp = spm.SentencePieceProcessor(model_file=model)
    except (OSError, RuntimeError) as e:
        raise UserError(f"--spm-model {args.spm_model or model}: not a sentencepiece model ({e})") from None
    prefixes = [os.path.join(raw, split) for split in ("train", "valid", "test")] + list(extra)
    for prefix in prefixes:
        for lang in (args.source_lang, args.target_lang):
            lines = read_lines(f"{prefix}.{lang}")
            with atomic_path(os.path.join(out, f"{os.path.basename(prefix)}.{lang}")) as tmp, \
                    open(tmp, "w", encoding="utf-8") as g:
                for pieces in sp.encode(lines, out_type=str):
                    g.write(" ".join(pieces) + "\n")
    return out, [os.path.join(out, os.path.basename(p)) for p in extra]


def source_only(args, data_bin: str, subsets: Sequence[str]) -> str:
    """``DATA_BIN/source-only``: the dictionaries and the source side of each test subset, what
    ``fairseq-generate`` translates.  Without the references' side, fairseq checks only the
    sources against the model's positions (a reference only serves scoring, on the raw text)."""
    dest = os.path.join(data_bin, "source-only")
    part = dest + ".part"
    shutil.rmtree(part, ignore_errors=True)
    os.makedirs(part)
    names = [f"dict.{lang}.txt" for lang in (args.source_lang, args.target_lang)]
    names += [f"{subset}.{args.source_lang}-{args.target_lang}.{args.source_lang}.{ext}" for subset in subsets
              for ext in ("bin", "idx")]
    for name in names:
        shutil.copyfile(os.path.join(data_bin, name), os.path.join(part, name))
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(part, dest)
    return dest


def binarize(args, text_dir: str, extra: Sequence[str]) -> str:
    """``fairseq-preprocess``: subsets train, valid, test and test1, test2, ... for ``--extra-test``,
    and their sources alone in ``data-bin/source-only`` (:func:`source_only`)."""
    dest = os.path.join(args.workdir, "data-bin")
    marker = os.path.join(dest, "preprocess.done")
    tests = [os.path.join(text_dir, "test")] + list(extra)
    subsets = ["test"] + [f"test{i}" for i in range(1, len(extra) + 1)]
    if os.path.exists(marker) and read_lines(marker) == tests:
        if not os.path.isdir(os.path.join(dest, "source-only")):  # a work dir of an earlier version
            source_only(args, dest, subsets)
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    log("fairseq-preprocess")
    run(["fairseq-preprocess", "--source-lang", args.source_lang, "--target-lang", args.target_lang,
         "--trainpref", os.path.join(text_dir, "train"), "--validpref", os.path.join(text_dir, "valid"),
         "--testpref", ",".join(tests), "--destdir", dest, "--joined-dictionary",
         "--workers", "1"], os.path.join(args.workdir, "preprocess.log"))
    source_only(args, dest, subsets)
    write_text(marker, "\n".join(tests) + "\n")
    return dest


# ---------------------------------------------------------------------------------------------
# the work dir: what it was made with


def data_config(args) -> dict:
    """The options the work dir's data (raw/, spm/, data-bin/) are built from."""
    cfg = {"source_lang": args.source_lang, "target_lang": args.target_lang}
    if args.data:
        cfg.update(data=os.path.abspath(args.data),
                   spm_model=os.path.abspath(args.spm_model) if args.spm_model else None,
                   spm_vocab_size=None if args.spm_model else args.spm_vocab_size)
    else:  # the synthetic test set is drawn per bucket
        cfg.update(data=None, train_size=args.train_size, test_per_bucket=args.test_per_bucket, data_seed=args.data_seed,
                   buckets=[bucket_label(b) for b in args.buckets])
    return cfg


def extra_config(args) -> List[dict]:
    """Each ``--extra-test``: its name and the digest of its source (what its translations depend on)."""
    return [{"name": name, "source_sha1": file_digest(src)} for name, src, _ in args.extra_test]


def system_config(args, flags: List[str], seed: int, name: str = "", variant: Optional[Tuple[str, dict]] = None) -> dict:
    """The options a system's checkpoint and translations depend on (its data's included); a
    ``--decode-variant`` (``variant`` = (base, overrides)) adds its base and its overrides."""
    if variant is not None:
        base, overrides = variant
        return {**system_config(args, flags, seed, base), "decode_variant_of": base,
                "model_overrides": json.loads(json.dumps(overrides))}
    config = {
        "flags": list(flags), "arch": args.arch, "train_flags": args.train_flags, "max_update": args.max_update,
        "max_tokens": args.max_tokens, "lr": args.lr, "warmup": args.warmup, "seed": seed, "beam": args.beam,
        "lenpen": args.lenpen, "data": data_config(args)}
    if "--pe-floater-bias" in flags or "floater" in flags:
        # FLOATER's defaults changed (bounded h, Δt 0.1, the official initialisation): a run made with the
        # earlier ones is another model
        from fairseq_pe.positional.floater import BOUND_DEFAULTS, FLOATER_DEFAULTS

        config["floater_defaults"] = {"pe_floater_init": FLOATER_DEFAULTS["pe_floater_init"],
                                      "pe_floater_dt": FLOATER_DEFAULTS["pe_floater_dt"],
                                      "pe_floater_bound": BOUND_DEFAULTS}
    if name in WARM_STARTED:
        base, share = WARM_STARTED[name]
        config["warm_start"] = {"flags": list(base), "updates": warm_start_updates(args.max_update, share)}
    return json.loads(json.dumps(config))


def warm_start_updates(max_update: int, share: float) -> int:
    """Updates of a warm-started system's first stage (at least one, and one left for the second)."""
    return min(max(1, round(max_update * share)), max_update - 1)


def _read_json(path: str) -> Optional[dict]:
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"--workdir: {path} is unreadable ({e}); remove it, or choose another --workdir") from None


def _differences(have: dict, want: dict) -> List[str]:
    out = []
    for key in sorted(set(have) | set(want)):
        if have.get(key) != want.get(key):
            flag = "flags" if key == "flags" else "--" + key.replace("_", "-")
            out.append(f"{flag} {have.get(key)!r} there, {want.get(key)!r} now")
    return out


def check_workdir(args, systems: Sequence[Tuple[str, List[str]]], variants: Optional[Dict[str, tuple]] = None) -> dict:
    """Refuse a folder the quickstart did not make, and (without ``--force``) a work dir whose data
    or systems were made with other options: reusing them would mix settings, rebuilding would
    replace results.  Returns the record to write into ``WORK/quickstart.json``."""
    work = args.workdir
    want = json.loads(json.dumps({"data": data_config(args), "extra_tests": extra_config(args)}))
    if os.path.exists(work) and not os.path.isdir(work):
        raise UserError(f"--workdir {work} is a file, not a folder")
    have = _read_json(os.path.join(work, WORK_MARKER))
    entries = set(os.listdir(work)) if os.path.isdir(work) else set()
    if have is None and entries:
        earlier = os.path.isfile(os.path.join(work, "data-bin", "preprocess.done")) and entries <= set(WORK_ENTRIES)
        if not earlier:
            raise UserError(f"--workdir {work} exists, holds other files ({', '.join(sorted(entries)[:4])}) and was "
                            f"not made by fairseq-pe-quickstart (no {WORK_MARKER}): choose a new or empty --workdir")
        log(f"{work}: a work dir of an earlier version (its options were not recorded); reusing it")
    problems, rebuild = [], set()
    if have is not None:
        data = _differences(_renamed_data_seed(have.get("data", {})), want["data"])
        if data:
            problems += data
            rebuild |= {"raw", "spm", "data-bin", "extra"}
        old, new = have.get("extra_tests", []), want["extra_tests"]
        if new[:len(old)] != old:  # more test sets are fine; changed ones would keep stale translations
            problems.append(f"--extra-test {[e['name'] for e in old]} there, {[e['name'] for e in new]} now, or a "
                            "source file changed (test sets can be added at the end; changing or removing one "
                            "would leave translations of the old one)")
            rebuild |= {"data-bin", "extra"}
    moves = []  # (folder of an earlier version's one seed, its seed-S folder now)
    for (name, flags), seed in [(system, seed) for seed in args.seeds for system in systems]:
        folder = system_dir(args, name, seed)
        earlier = os.path.dirname(folder)  # systems/NAME: where versions before --seeds trained their one seed
        if not os.path.exists(folder) and (_read_json(os.path.join(earlier, "system.json")) or {}).get(
                "config", {}).get("seed") == seed:
            moves.append((earlier, folder))
            folder = earlier
        record = _read_json(os.path.join(folder, "system.json"))
        results = os.path.isdir(folder) and any(f == "train.done" or f.startswith("generate-")
                                                 for f in os.listdir(folder))
        if record is not None and results:
            have_cfg = dict(record.get("config", {}))
            want_cfg = system_config(args, flags, seed, name, (variants or {}).get(name))
            if _renamed_data_seed(have_cfg.pop("data", None) or {}) != want_cfg.pop("data"):
                problems.append(f"system {name} (seed {seed}): trained on other data")
            problems += [f"system {name} (seed {seed}): {d}" for d in _differences(have_cfg, want_cfg)]
    if problems and not args.force:
        raise UserError(f"--workdir {work} holds results made with other options ({'; '.join(problems)}): pass "
                        "--force to rebuild and retrain, or choose another --workdir")
    for entry in sorted(rebuild):  # --force: the quickstart's own folders, rebuilt below
        shutil.rmtree(os.path.join(work, entry), ignore_errors=True)
    for earlier, folder in moves:  # adopted: the run moves into its seed's folder, nothing is trained again
        os.makedirs(folder)
        for entry in os.listdir(earlier):
            if not entry.startswith("seed-"):
                os.rename(os.path.join(earlier, entry), os.path.join(folder, entry))
        log(f"{earlier}: a run of an earlier version, moved into {folder}")
    return want


def _renamed_data_seed(data: dict) -> dict:
    """A data record of a version before ``--data-seed``, whose synthetic corpus seed was ``seed``."""
    if "seed" in data and "data_seed" not in data:
        data = dict(data)
        data["data_seed"] = data.pop("seed")
    return data


def system_dir(args, name: str, seed: int) -> str:
    """``WORK/systems/NAME/seed-S``: one training run of a system."""
    return os.path.join(args.workdir, "systems", name, f"seed-{seed}")


def check_inputs_outside_outputs(args, extra_names: Sequence[str]):
    """No input (``--data``, ``--extra-test``, ``--spm-model``) is a file the quickstart writes."""
    from fairseq_pe.outputs import check_not_inputs

    work = args.workdir
    langs = (args.source_lang, args.target_lang)
    written = [os.path.join(work, "spm", f"{p}.{lang}") for p in ["train", "valid", "test", *extra_names]
               for lang in langs]
    written += [os.path.join(work, f"results{ext}") for ext in (".txt", ".json", ".png", "-loss.png")]
    if not args.data:
        written += [os.path.join(work, "raw", f"{p}.{lang}") for p in ("train", "valid", "test") for lang in langs]
    inputs = [("--extra-test", p) for _, src, ref in args.extra_test for p in (src, ref)]
    if args.data:
        inputs += [("--data", os.path.join(args.data, f"{split}.{lang}")) for split in ("train", "valid", "test")
                   for lang in langs]
        if os.path.isdir(work) and same_file(args.data, work):
            raise UserError(f"--data {args.data} is the --workdir: choose another --workdir")
    check_not_inputs(written, inputs, flag="--workdir")


# ---------------------------------------------------------------------------------------------
# training and decoding


def source_positions(ckpt: str, data_bin: str) -> Optional[int]:
    """How many source tokens (``</s>`` included) the checkpoint's model takes; None: any number
    (fairseq-generate's own check, ``utils.resolve_max_positions``, with the task unlimited)."""
    from fairseq import checkpoint_utils

    import fairseq_pe  # noqa: F401  (registers the models)

    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([ckpt], arg_overrides={"data": data_bin})
    limit = models[0].max_positions()
    if isinstance(limit, (tuple, list)):
        limit = limit[0]
    return None if limit is None or limit >= GENERATE_MAX_POSITIONS else int(limit)


def source_sizes(args, data_bin: str, subsets: Sequence[str], lang: Optional[str] = None) -> Dict[str, List[int]]:
    """Tokens of each test source as fairseq-generate sees them (``</s>`` included), per subset
    (of the ``lang`` side: the target's for the training length)."""
    from fairseq.data import Dictionary, data_utils

    quiet = logging.getLogger(data_utils.__name__)
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    lang = lang or args.source_lang
    try:
        d = Dictionary.load(os.path.join(data_bin, f"dict.{lang}.txt"))
        out = {}
        for subset in subsets:
            prefix = os.path.join(data_bin, f"{subset}.{args.source_lang}-{args.target_lang}.{lang}")
            dataset = data_utils.load_indexed_dataset(prefix, d)  # kept alive: .sizes lives in its mmap
            out[subset] = [int(n) for n in dataset.sizes]
            del dataset
    finally:
        quiet.setLevel(level)
    return out


class SystemRun:
    """What one system produced: per test subset, the fairseq-generate output (None when no
    sentence of it could be translated), the sentence ids that were not translated and why, and
    the subsets whose decoding failed (why)."""

    def __init__(self, checkpoint: str = "", folder: str = "", overrides: Optional[dict] = None):
        self.checkpoint = checkpoint
        self.folder = folder or os.path.dirname(checkpoint)  # its outputs (a --decode-variant's own)
        self.overrides = overrides or {}  # --model-overrides of a --decode-variant
        self.outputs: Dict[str, Optional[str]] = {}
        self.skipped: Dict[str, List[int]] = {}
        self.reasons: Dict[str, str] = {}
        self.errors: Dict[str, str] = {}


def too_long_reason(what: str, sizes: Sequence[int], skipped: Sequence[int], limit: int) -> str:
    longest = max(skipped, key=lambda i: sizes[i])
    return (f"{len(skipped)} of {len(sizes)} {what} sources are longer than the {limit} source positions of "
            f"the model (--max-source-positions; the longest, sentence {longest}, has {sizes[longest]} tokens "
            "with </s>): not translated, so not scored")


def train_and_decode(args, data_bin: str, name: str, flags: List[str], seed: int, tests: Dict[str, int],
                     sizes: Dict[str, List[int]], what: Dict[str, str],
                     variant: Optional[Tuple[str, dict]] = None) -> SystemRun:
    """fairseq-train (unless trained already) then fairseq-generate on every test subset not decoded yet.
    A ``--decode-variant`` (``variant`` = (base, overrides)) trains nothing: it decodes the base system's
    checkpoint of the same seed with ``--model-overrides`` into its own folder.

    Each subset is translated from its sources alone (``data-bin/source-only``); sources longer
    than the model's positions are skipped and named, never silently.  A failed decoding marks its
    subset (``SystemRun.errors``) and the other subsets go on; a failed training raises."""
    out = system_dir(args, name, seed)
    system = name
    name = name if len(args.seeds) == 1 else f"{name} (seed {seed})"  # in the log
    os.makedirs(out, exist_ok=True)
    # unbuffered: fairseq logs to stdout, which a pipe would otherwise hold back until the end
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               PYTHONUNBUFFERED="1")
    ckpt = os.path.join(out, "checkpoint_last.pt")
    record_path = os.path.join(out, "system.json")
    record = _read_json(record_path) or {}
    gen_outs = {subset: os.path.join(out, f"generate-{subset}.txt") for subset in tests}
    trained = not args.force and os.path.exists(ckpt) and os.path.exists(os.path.join(out, "train.done"))
    overrides = []
    if variant is not None:
        base_dir = system_dir(args, variant[0], seed)
        ckpt = os.path.join(base_dir, "checkpoint_last.pt")
        if not (os.path.exists(ckpt) and os.path.exists(os.path.join(base_dir, "train.done"))):
            raise RuntimeError(f"--decode-variant {system}: system {variant[0]} (seed {seed}) has no trained "
                               f"checkpoint ({ckpt})")
        overrides = ["--model-overrides", repr(variant[1])]
        want = system_config(args, flags, seed, system, variant)
        if args.force or record.get("config") != want:  # decoded with other overrides (or --force): again
            for stale in list(gen_outs.values()) + [os.path.join(out, f"losses-{t}.json") for t in tests]:
                if os.path.exists(stale):
                    os.remove(stale)
            record = {"config": want}
        trained = True

    def too_long(limit) -> Dict[str, List[int]]:
        if limit is None:
            return {subset: [] for subset in tests}
        return {subset: [i for i, n in enumerate(sizes[subset]) if n > limit] for subset in tests}

    def remember_limit():
        record["source_positions"] = source_positions(ckpt, data_bin)
        write_json(record_path, record)

    if trained and "source_positions" not in record:  # a work dir of an earlier version (or a variant): adopted
        record.setdefault("config", system_config(args, flags, seed, system, variant))
        remember_limit()
    limit = record.get("source_positions")  # unknown (no checkpoint kept): the outputs have every sentence
    skipped = too_long(limit)
    todo = [subset for subset in tests
            if args.force or not (os.path.exists(gen_outs[subset]) or len(skipped[subset]) == tests[subset])]
    if todo and not trained:
        # start from scratch: fairseq-train would otherwise resume from a stale checkpoint_last.pt
        shutil.rmtree(out)
        os.makedirs(out)
        record = {"config": system_config(args, flags, seed, system)}
        write_json(record_path, record)
        last_report = [0.0]

        def progress(line):
            # "num_updates=50, loss=..." mid-epoch (simple format), "| num_updates 688 | loss ..." at epoch ends
            m = re.search(r"num_updates[= ](\d+)", line)
            loss = re.search(r"\bloss[= ]([\d.]+)", line)
            if m and time.time() - last_report[0] > args.progress_seconds:
                last_report[0] = time.time()
                log(f"{name}: update {m.group(1)}/{args.max_update}" + (f", loss {loss.group(1)}" if loss else ""))

        t0 = time.time()

        def train(flags_, save_dir, max_update, log_path, extra=()):
            run(["fairseq-train", data_bin, "--user-dir", PLUGIN_DIR, "--task", "translation",
                 "--source-lang", args.source_lang, "--target-lang", args.target_lang,
                 "--arch", args.arch, *flags_, *args.train_flags.split(),
                 "--share-all-embeddings", "--dropout", "0.1",
                 "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0",
                 "--lr", str(args.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(args.warmup),
                 "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                 "--max-tokens", str(args.max_tokens), "--max-update", str(max_update),
                 "--save-dir", save_dir, "--no-epoch-checkpoints", "--save-interval-updates", "0",
                 "--log-format", "simple", "--log-interval", str(min(50, max(1, args.max_update // 10))),
                 "--seed", str(seed), "--cpu", "--num-workers", "0", *extra],
                log_path, env=env, on_line=progress)

        if system in WARM_STARTED:
            base, share = WARM_STARTED[system]
            first = warm_start_updates(args.max_update, share)
            stage = os.path.join(out, "stage1")
            log(f"{name}: training {first} updates ({' '.join(base)}), then converting it for FLOATER")
            train(base, stage, first, stage + ".log")
            converted = os.path.join(out, "warm-start.pt")
            run(["fairseq-pe-warm-start-floater", os.path.join(stage, "checkpoint_last.pt"), converted],
                os.path.join(out, "warm-start.log"), env=env)
            # the converted checkpoint has no optimizer state: fairseq-train starts a fresh Adam (and counts
            # updates, the warm-up included, from 0), for the rest of the budget
            log(f"{name}: warm-started; fine-tuning {args.max_update - first} updates ({' '.join(flags)})")
            train(flags, out, args.max_update - first, os.path.join(out, "train.log"),
                  ["--restore-file", converted, "--reset-optimizer"])
            shutil.rmtree(stage)  # its checkpoints served the conversion (its log stays: stage1.log)
            os.remove(converted)
        else:
            log(f"{name}: training ({' '.join(flags)})")
            train(flags, out, args.max_update, os.path.join(out, "train.log"))
        write_text(os.path.join(out, "train.done"), f"{time.time() - t0:.1f}\n")
        log(f"{name}: trained in {time.time() - t0:.0f}s")
        remember_limit()
        limit = record["source_positions"]
        skipped = too_long(limit)
        todo = list(tests)
    result = SystemRun(ckpt, out, variant[1] if variant else None)
    for subset, n in tests.items():
        result.skipped[subset] = skipped[subset]
        if skipped[subset]:
            result.reasons[subset] = too_long_reason(what[subset], sizes[subset], skipped[subset], limit)
        result.outputs[subset] = gen_outs[subset] if len(skipped[subset]) < n else None
    for subset in todo:
        n = tests[subset]
        if len(skipped[subset]) == n:
            log(f"{name}: {subset}: {result.reasons[subset]}")
            continue
        if skipped[subset]:
            log(f"{name}: {subset}: {result.reasons[subset]}")
        log(f"{name}: decoding {n - len(skipped[subset])} sentences of subset {subset}")
        t0 = time.time()
        gen_cmd = ["fairseq-generate", os.path.join(data_bin, "source-only"), "--user-dir", PLUGIN_DIR,
                   "--task", "translation", "--source-lang", args.source_lang, "--target-lang", args.target_lang,
                   "--path", ckpt, "--gen-subset", subset, "--beam", str(args.beam), "--lenpen", str(args.lenpen),
                   "--batch-size", str(args.gen_batch_size), "--required-batch-size-multiple", "1",
                   "--max-len-a", "1.5", "--max-len-b", "10", "--cpu", "--num-workers", "0",
                   "--max-source-positions", str(GENERATE_MAX_POSITIONS),
                   "--max-target-positions", str(GENERATE_MAX_POSITIONS), *overrides]
        if skipped[subset]:  # exactly these: read_generate_output checks that the others are all there
            gen_cmd.append("--skip-invalid-size-inputs-valid-test")
        if args.data:
            gen_cmd += ["--post-process", "sentencepiece"]
        try:
            run(gen_cmd, gen_outs[subset] + ".log", env=env)
        except RuntimeError as e:
            result.errors[subset] = f"decoding failed (fairseq-generate; its log: {gen_outs[subset]}.log)"
            log(f"{name}: decoding {subset} FAILED; the other test sets go on\n{e}")
            continue
        shutil.move(gen_outs[subset] + ".log", gen_outs[subset])
        log(f"{name}: decoded {subset} in {time.time() - t0:.0f}s")
    return result


def test_lengths(args, sources: Sequence[str]) -> List[int]:
    """Source length of each test line in ``--length-unit``."""
    from fairseq_pe.translation.s2l import source_lengths

    if args.length_unit == "word":
        return source_lengths(sources, "word")
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.workdir, "spm", "spm.model"))
    return source_lengths(sources, "subword", sp)


def subset_scores(run: SystemRun, subset: str, refs: Sequence[str], lengths: Sequence[int], buckets,
                  failures: List[str], name: str, column: str, bootstrap: int = 0) -> Dict[str, dict]:
    """The scores of one test subset; those that need a sentence that was not translated, or all of
    them when the decoding failed, are :func:`~fairseq_pe.translation.bleu.unavailable` with the reason."""
    n = len(refs)
    reason = run.errors.get(subset) or run.reasons.get(subset)
    hyps: List[Optional[str]] = [None] * n
    if subset in run.errors:
        failures.append(f"{name}/{column}: {run.errors[subset]}")
    elif run.outputs.get(subset):
        try:
            hyps = [s.hypothesis for s in read_generate_output(run.outputs[subset], expected=n,
                                                               not_translated=run.skipped.get(subset, ()))]
        except (GenerateOutputError, OSError) as e:
            reason = f"the translations cannot be read: {e}"
            failures.append(f"{name}/{column}: {reason}")
    return bucketed_bleu(hyps, refs, lengths, buckets, missing_reason=reason, n_bootstrap=bootstrap)


def score(args, raw: str, run: SystemRun, lengths: Sequence[int], name: str = "",
          failures: Optional[List[str]] = None) -> Dict[str, dict]:
    """Bucketed sacreBLEU on the main test set (its source ``lengths``: :func:`test_lengths`) plus one
    overall score per ``--extra-test``, each with sacreBLEU's bootstrap interval (``--bootstrap``)."""
    failures = [] if failures is None else failures
    refs = read_lines(os.path.join(raw, f"test.{args.target_lang}"))
    result = subset_scores(run, "test", refs, lengths, args.buckets, failures, name, "test", args.bootstrap)
    for i, (extra, _, ref) in enumerate(args.extra_test, start=1):
        refs = read_lines(ref)
        result[extra] = subset_scores(run, f"test{i}", refs, [0] * len(refs), [(0, None)], failures, name,
                                      extra, args.bootstrap)["all"]
    return result


def reference_losses(args, data_bin: str, run: SystemRun, subset: str, name: str):
    """The teacher-forced NLL of every reference of a test subset, as ``fairseq-pe-bucket-loss``
    scores it (sentences beyond the model's positions: ``nll`` None and the reason); cached in the
    system's folder as ``losses-SUBSET.json``."""
    from fairseq_pe.translation import bucket_loss

    cache = os.path.join(run.folder, f"losses-{subset}.json")
    stored = _read_json(cache)
    if stored is None:
        model, task = bucket_loss.load_system(name, run.checkpoint, data_bin, run.overrides, cpu=True)
        dataset, _ = bucket_loss.binary_test_set(task, subset, data_bin, train=False)
        losses = bucket_loss.score_references(model, task, dataset, args.max_tokens, "report", name)
        stored = [{"nll": None if x.nll is None else [round(v, 5) for v in x.nll], "why": x.why} for x in losses]
        write_json(cache, stored, indent=None)
    return [bucket_loss.SentenceLoss(x["nll"], x["why"]) for x in stored]


def loss_scores(losses, lengths: Sequence[int], buckets) -> Dict[str, dict]:
    """NLL per bucket and overall (:func:`fairseq_pe.translation.bucket_loss.aggregate`); a score that would need a
    sentence beyond the model's positions is unavailable (``"na"``: why), never computed on the rest."""
    from fairseq_pe.translation.bucket_loss import BEYOND, aggregate

    example = next((x.why for x in losses if x.nll is None), "")
    out = {}
    for label, entry in aggregate(losses, lengths, buckets).items():
        if label == BEYOND:
            continue
        if entry.get("beyond"):
            entry = {"nll": None, "n": entry["n"],
                     "na": f"{entry['beyond']} of {entry['n']} sentences need more positions than the model has "
                           f"(e.g. {example}): loss not computed"}
        out[label] = entry
    return out


def losses_of(args, data_bin: str, run: SystemRun, lengths: Sequence[int], name: str) -> Tuple[Dict[str, dict], list]:
    """Loss per bucket of the main test set and overall per ``--extra-test`` (as :func:`score`), and the
    sentence losses of the main test set (for the curve against target position)."""
    losses = reference_losses(args, data_bin, run, "test", name)
    result = loss_scores(losses, lengths, args.buckets)
    for i, (extra, _, _) in enumerate(args.extra_test, start=1):
        extra_losses = reference_losses(args, data_bin, run, f"test{i}", name)
        result[extra] = loss_scores(extra_losses, [0] * len(extra_losses), [(0, None)])["all"]
    return result, losses


def report(args, raw: str, data_bin: str, systems, outputs: Dict[Tuple[str, int], SystemRun],
           complete: Sequence[str]) -> Tuple[Dict[str, Dict[str, dict]], List[str]]:
    """Score every run of the ``complete`` systems (BLEU with its bootstrap interval, length ratio, the
    references' loss), combine the seeds, print the tables and write ``results.{txt,json,png}`` and
    ``results-loss.png``.  Returns the combined BLEU results and the columns that could not be computed."""
    from fairseq_pe.translation import bucket_loss

    seeds = args.seeds
    extra_names = [name for name, _, _ in args.extra_test]
    column_failures: List[str] = []
    bleu_per_seed, loss_per_seed, sentence_losses = {}, {}, {}
    lengths = test_lengths(args, read_lines(os.path.join(raw, f"test.{args.source_lang}")))  # once for all runs
    log("scoring: sacreBLEU per bucket (with its bootstrap interval) and the references' loss per bucket")
    for seed in seeds:
        bleu_per_seed[seed], loss_per_seed[seed] = {}, {}
        for name in complete:
            run = outputs[name, seed]
            label = name if len(seeds) == 1 else f"{name} (seed {seed})"
            bleu_per_seed[seed][name] = score(args, raw, run, lengths, label, column_failures)
            loss_per_seed[seed][name], losses = losses_of(args, data_bin, run, lengths, label)
            sentence_losses.setdefault(name, []).extend(losses)
    results, loss_results = combine(bleu_per_seed), combine(loss_per_seed)
    spread = describe_seeds(seeds, args.bootstrap)
    where = "synthetic task, trained on 1-16 words" if not args.data else args.data
    title = f"sacreBLEU per source-length bucket ({where}; {args.arch}, {args.max_update} updates)\n{spread}"
    table = format_table(results, args.buckets, title, extras=extra_names)
    ratios = format_table(results, args.buckets, "length ratio" + ("" if len(seeds) == 1 else f" ({spread})"),
                          extras=extra_names, key="ratio")
    loss_spread = "one seed" if len(seeds) == 1 else spread
    loss_table = format_table(loss_results, args.buckets, f"loss of the references, NLL in bits per token ({loss_spread})",
                              extras=extra_names, key="nll")
    unit = "words" if args.length_unit == "word" else "sentencepiece tokens"
    curves = {name: bucket_loss.per_position(sentence_losses[name]) for name in complete}
    train_length = max(source_sizes(args, data_bin, ["train"], lang=args.target_lang)["train"])
    bucket_loss.plot({name: {"buckets": loss_results[name], "positions": curves[name], "train_length": train_length}
                      for name in complete}, args.buckets, os.path.join(args.workdir, "results-loss.png"),
                     "teacher-forced loss" + (f" (mean of {len(seeds)} seeds)" if len(seeds) > 1 else " (one seed)"),
                     f"source length ({unit})")
    payload = {"buckets": [bucket_label(b) for b in args.buckets], "length_unit": unit, "seeds": seeds,
               "longest_training_target": train_length,
               "extra_tests": {name: {"source": s, "reference": r} for name, s, r in args.extra_test},
               "systems": results, "loss": loss_results, "loss_per_target_position": curves,
               "per_seed": {str(seed): {"bleu": bleu_per_seed[seed], "loss": loss_per_seed[seed]} for seed in seeds},
               "flags": {n: fl for n, fl in systems if n in complete},
               "train_flags": args.train_flags, "arch": args.arch, "max_update": args.max_update}
    write_outputs(os.path.join(args.workdir, "results"), [table, ratios, loss_table], payload, results, args.buckets,
                  "BLEU by source length", extras=extra_names, xlabel=f"source length ({unit})", loss=loss_results)
    print("\n" + table + "\n\n" + ratios + "\n\n" + loss_table)
    return results, column_failures


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-pe-quickstart", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="quickstart-work", help="where data, checkpoints and results go")
    p.add_argument("--data", help="a real corpus directory with {train,valid,test}.{SRC,TGT} raw text "
                                  "(default: build the synthetic task)")
    p.add_argument("--source-lang", default="src")
    p.add_argument("--target-lang", default="tgt")
    p.add_argument("--spm-vocab-size", type=int, default=8000, help="sentencepiece size for --data")
    p.add_argument("--spm-model", help="with --data: use this sentencepiece model instead of training one")
    p.add_argument("--buckets", type=parse_buckets, default=None,
                   help="source-length bucket boundaries (default 1,17,25,33,49 synthetic; "
                        "1,20,40,60,80+ with --data); a trailing + makes the last bucket open")
    p.add_argument("--length-unit", choices=["word", "subword"], default="word",
                   help="unit of --buckets: source words, or sentencepiece tokens as the model sees them (--data)")
    p.add_argument("--extra-test", type=parse_extra_test, action="append", default=[], metavar="NAME=SRC,REF",
                   help="an additional test corpus (raw text), decoded by every system and reported as a "
                        "column NAME of the same table; repeat for several")
    p.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS),
                   help="encodings to compare: names of defaults or NAME=FLAGS")
    p.add_argument("--decode-variant", type=parse_decode_variant, action="append", default=[],
                   metavar="NAME=BASE:OVERRIDES",
                   help="one more row NAME: the checkpoints of system BASE (one of --systems) decoded and scored "
                        "with fairseq's --model-overrides OVERRIDES (a Python dict), without training, e.g. "
                        "\"rope-ntk=rope:{'pe_rope_scaling': 'ntk', 'pe_rope_scaling_factor': 4}\"; repeat for several")
    p.add_argument("--arch", default="transformer_pe_tiny")
    p.add_argument("--train-flags", default="", help="more fairseq-train flags for every system (one string)")
    p.add_argument("--train-size", type=int, default=20000, help="synthetic training pairs")
    p.add_argument("--test-per-bucket", type=int, default=150, help="synthetic test sentences per bucket")
    p.add_argument("--max-update", type=int, default=800)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--lenpen", type=float, default=1.0, help="fairseq-generate --lenpen")
    p.add_argument("--gen-batch-size", type=int, default=64, help="fairseq-generate --batch-size")
    p.add_argument("--seeds", type=int, nargs="+", default=[1], metavar="SEED",
                   help="training seeds: every system is trained once per seed and the tables show mean ± standard "
                        "deviation over them (default: one seed, 1, with sacreBLEU's bootstrap intervals)")
    p.add_argument("--data-seed", type=int, default=1, help="seed of the synthetic corpus (the same for every "
                                                            "training seed)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="sacreBLEU bootstrap resamples for the 95%% confidence interval of a single seed's BLEU")
    p.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)),
                   help="systems trained at the same time")
    p.add_argument("--threads", type=int, default=1, help="torch threads per job")
    p.add_argument("--force", action="store_true",
                   help="retrain and decode again every system that has results already (and rebuild the work "
                        "dir's data when its options changed)")
    p.add_argument("--progress-seconds", type=float, default=20.0)
    return p


@cli
def main(argv: Optional[List[str]] = None) -> None:
    run_quickstart(get_parser().parse_args(argv))


def run_quickstart(args) -> Dict[str, Dict[str, dict]]:
    """The whole quickstart; returns ``{system: {bucket: {"bleu", "n"}}}``."""
    if args.buckets is None:
        args.buckets = parse_buckets("1,20,40,60,80+" if args.data else "1,17,25,33,49")
    systems = [parse_system(s) for s in args.systems]
    if len(set(args.seeds)) != len(args.seeds):
        raise UserError(f"--seeds {' '.join(map(str, args.seeds))}: each seed once")
    if args.bootstrap < 0:
        raise UserError(f"--bootstrap {args.bootstrap}: give a number of resamples (0 for none; 1000 is usual)")
    if len({n for n, _ in systems}) != len(systems):
        raise UserError("--systems: names must be unique")
    trained_systems = dict(systems)
    variants = {}
    for name, base, overrides in args.decode_variant:
        if base not in trained_systems:
            raise UserError(f"--decode-variant {name}={base}:...: {base} is not one of --systems "
                            f"({' '.join(trained_systems)}); add it there")
        if name in trained_systems or name in variants:
            raise UserError(f"--decode-variant {name}: the name is taken; choose another")
        variants[name] = (base, overrides)
        # its row's flags: how to reproduce it with fairseq's CLIs
        systems.append((name, trained_systems[base] + ["--model-overrides", repr(overrides)]))
    for name, _ in systems:
        if not name or "/" in name or name.startswith("."):
            raise UserError(f"--systems: {name!r} cannot be a folder name")
    if args.length_unit == "subword" and not args.data:
        raise UserError("--length-unit subword needs --data (the synthetic task has no sentencepiece model)")
    if args.spm_model and not args.data:
        raise UserError("--spm-model needs --data (the synthetic task is not segmented)")
    extra_names = [name for name, _, _ in args.extra_test]
    bucket_names = {bucket_label(b) for b in args.buckets} | {"all", "signature"}
    if len(set(extra_names)) != len(extra_names) or bucket_names & set(extra_names):
        raise UserError(f"--extra-test: names must be unique and differ from {sorted(bucket_names)}")
    for name in extra_names:
        if "/" in name or name.startswith("."):
            raise UserError(f"--extra-test {name}: the name cannot be a file name")
    if args.data:
        check_data(args)
    check_extra_tests(args)
    check_inputs_outside_outputs(args, extra_names)
    record = check_workdir(args, systems, variants)
    os.makedirs(args.workdir, exist_ok=True)
    write_json(os.path.join(args.workdir, WORK_MARKER), record)
    for quiet in ("fairseq", "matplotlib", "PIL"):  # importing fairseq (positions of the models) turns on DEBUG
        logging.getLogger(quiet).setLevel(logging.WARNING)
    t0 = time.time()
    raw = prepare_corpus(args)
    extra = prepare_extra_tests(args)
    text_dir, extra_text = segment(args, raw, extra)
    data_bin = binarize(args, text_dir, extra_text)
    tests = {"test": count_lines(os.path.join(raw, f"test.{args.source_lang}"))}
    tests.update({f"test{i}": count_lines(f"{p}.{args.source_lang}") for i, p in enumerate(extra, start=1)})
    what = {"test": "test", **{f"test{i}": name for i, name in enumerate(extra_names, start=1)}}
    sizes = source_sizes(args, data_bin, list(tests))
    seeds = args.seeds
    runs = [(name, flags, seed) for seed in seeds for name, flags in systems if name not in variants]
    log(f"{len(trained_systems)} systems x {len(seeds)} seed(s) {seeds}: {len(runs)} trainings, {args.jobs} at a "
        f"time, {args.max_update} updates each" + (f"; then {len(variants)} decoding variant(s)" if variants else ""))
    outputs: Dict[Tuple[str, int], SystemRun] = {}
    failures: Dict[str, str] = {}
    # the variants decode their bases' checkpoints: they start once every training has ended
    for stage in (runs, [(name, flags, seed) for seed in seeds for name, flags in systems if name in variants]):
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {pool.submit(train_and_decode, args, data_bin, name, flags, seed, tests, sizes, what,
                                   variants.get(name)): (name, seed)
                       for name, flags, seed in stage}
            for future in as_completed(futures):
                name, seed = futures[future]
                try:
                    outputs[name, seed] = future.result()
                except Exception as e:  # report at once, finish the others, fail at the end
                    failures[f"{name} (seed {seed})"] = str(e)
                    log(f"{name} (seed {seed}): FAILED\n{e}")
    # a system is in the tables when every seed of it trained: a mean over fewer seeds would not compare
    complete = [name for name, _ in systems if all((name, seed) in outputs for seed in seeds)]
    if not complete:
        raise SystemExit(f"every system failed: {', '.join(failures)} (logs in {os.path.join(args.workdir, 'systems')})")
    results, column_failures = report(args, raw, data_bin, systems, outputs, complete)
    log(f"done in {time.time() - t0:.0f}s; results.txt, results.json, results.png and results-loss.png in {args.workdir}")
    problems = []
    if failures:
        problems.append(f"{len(failures)} training run(s) failed and their systems are missing from the table: "
                        f"{', '.join(failures)}")
    if column_failures:
        problems.append(f"{len(column_failures)} column(s) could not be computed and are marked n/a: "
                        + "; ".join(column_failures))
    if problems:
        raise SystemExit(" ".join(problems) + f" (logs in {os.path.join(args.workdir, 'systems')})")
    return results


if __name__ == "__main__":
    main()
