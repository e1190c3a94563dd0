"""The quickstart's training and decoding stage: ``fairseq-train`` per system and seed (FLOATER's warm start in two
stages), then ``fairseq-generate`` on every test subset, each source the model's positions can take."""

import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_pe.outputs import write_json, write_text
from fairseq_pe.translation.quickstart.common import GENERATE_MAX_POSITIONS, PLUGIN_DIR, WARM_STARTED, log, read_json, run
from fairseq_pe.translation.quickstart.workdir import system_config, system_dir, warm_start_updates


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
        #: seconds of its stages: "train" (from train.done: an adopted training's own), "decode SUBSET" (this run)
        self.seconds: Dict[str, float] = {}


def too_long_reason(what: str, sizes: Sequence[int], skipped: Sequence[int], limit: int) -> str:
    longest = max(skipped, key=lambda i: sizes[i])
    return (f"{len(skipped)} of {len(sizes)} {what} sources are longer than the {limit} source positions of "
            f"the model (--max-source-positions; the longest, sentence {longest}, has {sizes[longest]} tokens "
            "with </s>): not translated, so not scored")


class Job:
    """One system and seed: its folder, its checkpoint and its record (``system.json``)."""

    def __init__(self, args, data, system: str, seed: int, variant: Optional[Tuple[str, dict]]):
        self.args, self.data, self.system, self.seed, self.variant = args, data, system, seed, variant
        self.out = system_dir(args, system, seed)
        self.name = system if len(args.seeds) == 1 else f"{system} (seed {seed})"  # in the log
        # unbuffered: fairseq logs to stdout, which a pipe would otherwise hold back until the end
        self.env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
                        PYTHONUNBUFFERED="1")
        self.ckpt = os.path.join(self.out, "checkpoint_last.pt")
        self.record_path = os.path.join(self.out, "system.json")
        self.gen_outs = {subset: os.path.join(self.out, f"generate-{subset}.txt") for subset in data.tests}
        self.overrides: List[str] = []
        self.progress = None
        os.makedirs(self.out, exist_ok=True)
        self.record = read_json(self.record_path) or {}

    def too_long(self, limit) -> Dict[str, List[int]]:
        if limit is None:
            return {subset: [] for subset in self.data.tests}
        return {subset: [i for i, n in enumerate(self.data.sizes[subset]) if n > limit] for subset in self.data.tests}

    def remember_limit(self):
        self.record["source_positions"] = source_positions(self.ckpt, self.data.data_bin)
        write_json(self.record_path, self.record)


def train_and_decode(args, data, name: str, flags: List[str], seed: int,
                     variant: Optional[Tuple[str, dict]] = None) -> SystemRun:
    """fairseq-train (unless trained already) then fairseq-generate on every test subset not decoded yet.
    ``data``: the prepared data (:class:`~fairseq_pe.translation.quickstart.prepare.Prepared`).
    A ``--decode-variant`` (``variant`` = (base, overrides)) trains nothing: it decodes the base system's
    checkpoint of the same seed with ``--model-overrides`` into its own folder.

    Each subset is translated from its sources alone (``data-bin/source-only``); sources longer
    than the model's positions are skipped and named, never silently.  A failed decoding marks its
    subset (``SystemRun.errors``) and the other subsets go on; a failed training raises."""
    job = Job(args, data, name, seed, variant)
    trained = not args.force and os.path.exists(job.ckpt) and os.path.exists(os.path.join(job.out, "train.done"))
    if variant is not None:
        trained = use_base_checkpoint(job, flags)
    if trained and "source_positions" not in job.record:  # a work dir of an earlier version (or a variant): adopted
        job.record.setdefault("config", system_config(args, flags, seed, name, variant))
        job.remember_limit()
    limit = job.record.get("source_positions")  # unknown (no checkpoint kept): the outputs have every sentence
    skipped = job.too_long(limit)
    todo = [subset for subset in data.tests
            if args.force or not (os.path.exists(job.gen_outs[subset]) or len(skipped[subset]) == data.tests[subset])]
    if todo and not trained:
        train_system(job, flags)
        job.remember_limit()
        limit = job.record["source_positions"]
        skipped = job.too_long(limit)
        todo = list(data.tests)
    result = SystemRun(job.ckpt, job.out, variant[1] if variant else None)
    for subset, n in data.tests.items():
        result.skipped[subset] = skipped[subset]
        if skipped[subset]:
            result.reasons[subset] = too_long_reason(data.what[subset], data.sizes[subset], skipped[subset], limit)
        result.outputs[subset] = job.gen_outs[subset] if len(skipped[subset]) < n else None
    done = os.path.join(job.out, "train.done")
    if variant is None and os.path.exists(done):
        try:
            result.seconds["train"] = float(open(done).read().strip())
        except ValueError:  # a train.done of an earlier version, empty
            pass
    for subset in todo:
        decode(job, result, subset)
    return result


def use_base_checkpoint(job: Job, flags: List[str]) -> bool:
    """A ``--decode-variant``: the base system's checkpoint of the same seed, its overrides, and its translations
    removed when they were made with other overrides (or ``--force``).  Returns True (nothing to train)."""
    args, (base, overrides) = job.args, job.variant
    base_dir = system_dir(args, base, job.seed)
    job.ckpt = os.path.join(base_dir, "checkpoint_last.pt")
    if not (os.path.exists(job.ckpt) and os.path.exists(os.path.join(base_dir, "train.done"))):
        raise RuntimeError(f"--decode-variant {job.system}: system {base} (seed {job.seed}) has no trained "
                           f"checkpoint ({job.ckpt})")
    job.overrides = ["--model-overrides", repr(overrides)]
    want = system_config(args, flags, job.seed, job.system, job.variant)
    if args.force or job.record.get("config") != want:  # decoded with other overrides (or --force): again
        for stale in list(job.gen_outs.values()) + [os.path.join(job.out, f"losses-{t}.json") for t in job.data.tests]:
            if os.path.exists(stale):
                os.remove(stale)
        job.record = {"config": want}
    return True


def train_system(job: Job, flags: List[str]):
    """Train from scratch (fairseq-train would otherwise resume from a stale checkpoint_last.pt): in one stage,
    or FLOATER's warm start in two (:data:`~fairseq_pe.translation.quickstart.common.WARM_STARTED`)."""
    args, out = job.args, job.out
    shutil.rmtree(out)
    os.makedirs(out)
    job.record = {"config": system_config(args, flags, job.seed, job.system)}
    write_json(job.record_path, job.record)
    job.progress = progress_reporter(job)  # one for the job: both stages of a warm start
    t0 = time.time()
    if job.system in WARM_STARTED:
        warm_start(job, flags)
    else:
        log(f"{job.name}: training ({' '.join(flags)})")
        train_run(job, flags, out, args.max_update, os.path.join(out, "train.log"))
    write_text(os.path.join(out, "train.done"), f"{time.time() - t0:.1f}\n")
    log(f"{job.name}: trained in {time.time() - t0:.0f}s")


def warm_start(job: Job, flags: List[str]):
    """FLOATER's procedure (§4.4): the first stage's flags for its share of the updates, its last checkpoint
    converted by ``fairseq-pe-warm-start-floater``, then fine-tuned with ``flags`` for the rest."""
    args, out = job.args, job.out
    base, share = WARM_STARTED[job.system]
    first = warm_start_updates(args.max_update, share)
    stage = os.path.join(out, "stage1")
    log(f"{job.name}: training {first} updates ({' '.join(base)}), then converting it for FLOATER")
    train_run(job, base, stage, first, stage + ".log")
    converted = os.path.join(out, "warm-start.pt")
    run(["fairseq-pe-warm-start-floater", os.path.join(stage, "checkpoint_last.pt"), converted],
        os.path.join(out, "warm-start.log"), env=job.env)
    # the converted checkpoint has no optimizer state: fairseq-train starts a fresh Adam (and counts
    # updates, the warm-up included, from 0), for the rest of the budget
    log(f"{job.name}: warm-started; fine-tuning {args.max_update - first} updates ({' '.join(flags)})")
    train_run(job, flags, out, args.max_update - first, os.path.join(out, "train.log"),
              ["--restore-file", converted, "--reset-optimizer"])
    shutil.rmtree(stage)  # its checkpoints served the conversion (its log stays: stage1.log)
    os.remove(converted)


def train_run(job: Job, flags: Sequence[str], save_dir: str, max_update: int, log_path: str, extra=()):
    """One ``fairseq-train`` of ``max_update`` updates into ``save_dir``, its progress in the log."""
    args = job.args
    run(["fairseq-train", job.data.data_bin, "--user-dir", PLUGIN_DIR, "--task", "translation",
         "--source-lang", args.source_lang, "--target-lang", args.target_lang,
         "--arch", args.arch, *flags, *args.train_flags.split(),
         "--share-all-embeddings", "--dropout", "0.1",
         "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0",
         "--lr", str(args.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(args.warmup),
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--max-tokens", str(args.max_tokens), "--max-update", str(max_update),
         "--save-dir", save_dir, "--no-epoch-checkpoints", "--save-interval-updates", "0",
         "--log-format", "simple", "--log-interval", str(min(50, max(1, args.max_update // 10))),
         "--seed", str(job.seed), "--cpu", "--num-workers", "0", *extra],
        log_path, env=job.env, on_line=job.progress)


def progress_reporter(job: Job):
    """A callback for fairseq-train's lines: the update and loss in the log, at most every --progress-seconds."""
    last_report = [0.0]

    def progress(line):
        # "num_updates=50, loss=..." mid-epoch (simple format), "| num_updates 688 | loss ..." at epoch ends
        m = re.search(r"num_updates[= ](\d+)", line)
        loss = re.search(r"\bloss[= ]([\d.]+)", line)
        if m and time.time() - last_report[0] > job.args.progress_seconds:
            last_report[0] = time.time()
            log(f"{job.name}: update {m.group(1)}/{job.args.max_update}" + (f", loss {loss.group(1)}" if loss else ""))

    return progress


def decode(job: Job, result: SystemRun, subset: str):
    """``fairseq-generate`` of one test subset (the sources the model can take); a failure marks the subset."""
    n, skipped = job.data.tests[subset], result.skipped[subset]
    if len(skipped) == n:
        log(f"{job.name}: {subset}: {result.reasons[subset]}")
        return
    if skipped:
        log(f"{job.name}: {subset}: {result.reasons[subset]}")
    log(f"{job.name}: decoding {n - len(skipped)} sentences of subset {subset}")
    t0 = time.time()
    gen_out = job.gen_outs[subset]
    try:
        run(generate_command(job, subset, bool(skipped)), gen_out + ".log", env=job.env)
    except RuntimeError as e:
        result.errors[subset] = f"decoding failed (fairseq-generate; its log: {gen_out}.log)"
        log(f"{job.name}: decoding {subset} FAILED; the other test sets go on\n{e}")
        return
    shutil.move(gen_out + ".log", gen_out)
    result.seconds[f"decode {subset}"] = round(time.time() - t0, 1)
    log(f"{job.name}: decoded {subset} in {time.time() - t0:.0f}s")


def generate_command(job: Job, subset: str, skips: bool) -> List[str]:
    args = job.args
    cmd = ["fairseq-generate", os.path.join(job.data.data_bin, "source-only"), "--user-dir", PLUGIN_DIR,
           "--task", "translation", "--source-lang", args.source_lang, "--target-lang", args.target_lang,
           "--path", job.ckpt, "--gen-subset", subset, "--beam", str(args.beam), "--lenpen", str(args.lenpen),
           "--batch-size", str(args.gen_batch_size), "--required-batch-size-multiple", "1",
           "--max-len-a", "1.5", "--max-len-b", "10", "--cpu", "--num-workers", "0",
           "--max-source-positions", str(GENERATE_MAX_POSITIONS),
           "--max-target-positions", str(GENERATE_MAX_POSITIONS), *job.overrides]
    if skips:  # exactly these: read_generate_output checks that the others are all there
        cmd.append("--skip-invalid-size-inputs-valid-test")
    if args.data:
        cmd += ["--post-process", "sentencepiece"]
    return cmd


def train_all(args, data, systems: List[Tuple[str, List[str]]], variants: Dict[str, tuple]):
    """Every system once per seed, ``--jobs`` at a time, then the ``--decode-variant`` rows (they decode their
    bases' checkpoints).  Returns the runs ``{(name, seed): SystemRun}`` and the failures ``{label: why}``: a
    failure is reported at once, the others finish."""
    seeds = args.seeds
    runs = [(name, flags, seed) for seed in seeds for name, flags in systems if name not in variants]
    log(f"{len(systems) - len(variants)} systems x {len(seeds)} seed(s) {seeds}: {len(runs)} trainings, {args.jobs} "
        f"at a time, {args.max_update} updates each" + (f"; then {len(variants)} decoding variant(s)" if variants else ""))
    outputs: Dict[Tuple[str, int], SystemRun] = {}
    failures: Dict[str, str] = {}
    for stage in (runs, [(name, flags, seed) for seed in seeds for name, flags in systems if name in variants]):
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {pool.submit(train_and_decode, args, data, name, flags, seed, variants.get(name)): (name, seed)
                       for name, flags, seed in stage}
            for future in as_completed(futures):
                name, seed = futures[future]
                try:
                    outputs[name, seed] = future.result()
                except Exception as e:  # report at once, finish the others, fail at the end
                    failures[f"{name} (seed {seed})"] = str(e)
                    log(f"{name} (seed {seed}): FAILED\n{e}")
    return outputs, failures
