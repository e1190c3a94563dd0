"""The quickstart's work dir: what its data and each system were made with (``quickstart.json``,
``systems/NAME/seed-S/system.json``), checked before a run reuses them."""

import json
import os
import shutil
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_pe.errors import UserError
from fairseq_pe.outputs import file_digest, same_file
from fairseq_pe.translation.bleu import bucket_label
from fairseq_pe.translation.quickstart.common import WARM_STARTED, WORK_ENTRIES, WORK_MARKER, log, read_json


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
    have = read_json(os.path.join(work, WORK_MARKER))
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
        if not os.path.exists(folder) and (read_json(os.path.join(earlier, "system.json")) or {}).get(
                "config", {}).get("seed") == seed:
            moves.append((earlier, folder))
            folder = earlier
        record = read_json(os.path.join(folder, "system.json"))
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

