# shellcheck shell=bash
# Shared steps of the CPU language-model recipes (lm-cpu-extrapolation.sh, lm-cpu-counting.sh); sourced, not run.
#
# The sourcing recipe sets PROG (its file name, for errors), TAG (its log prefix), REPO, PYTHON, WORK, SYSTEMS (catalogue
# names), SEEDS, JOBS, THREADS, DRY_RUN, PLUGIN and the training's ARCH, LR, WARMUP, MAX_TOKENS, MAX_UPDATE.  This file
# gives:
#   catalogue ARGS...      python -m fairseq_pe.systems ARGS (the one catalogue of systems)
#   die MSG / log MSG      an error naming the recipe (exit 2) / a time-stamped line on stderr
#   run LOG CMD...         DRY_RUN=1: prints the command ("+ " and shell-quoted); otherwise runs it, its output to LOG
#                          (the tail shown on failure)
#   read_systems           FLAGS[NAME]: each system's --pe-* flags from the catalogue, an unknown name refused by name;
#                          every seed checked
#   train_systems DESC OPTIONS...
#                          each system of SYSTEMS and seed of SEEDS not trained yet (WORK/runs/NAME-sSEED/train.done),
#                          JOBS at a time, THREADS torch threads each: fairseq-train's language_modeling task on
#                          WORK/data with the recipes' shared settings (ARCH and the system's flags, tied embeddings,
#                          dropout 0.1, Adam (0.9, 0.98), weight decay 0.01, lr LR after WARMUP updates, inverse square
#                          root, MAX_UPDATE updates of MAX_TOKENS tokens, --cpu) and the recipe's OPTIONS (its samples,
#                          criterion, logging); DESC: the settings its start line names.  CHECKPOINTS: every run's
#                          NAME=.../checkpoint_last.pt.  ARCH_ARGS: more model flags after --arch (a size between
#                          the registered ones, e.g. "--decoder-embed-dim 192 --decoder-ffn-embed-dim 768").  VALIDATE_EVERY=N (default 0: once per epoch) validates every N
#                          updates (the loss at L against the tokens seen: fairseq-pe-lm-curves); SAVE_EVERY=N (default
#                          0: at the end of an epoch) saves checkpoint_last.pt every N updates.  A run interrupted
#                          before its train.done resumes from its checkpoint_last.pt (fairseq's own restore, its log
#                          appended) when its command (WORK/runs/NAME-sSEED/train.cmd) is the same, else starts again;
#                          a checkpoint_last.pt that does not load (killed while fairseq copied it) is replaced by the
#                          newest interval checkpoint that does
#   prepare_data           WORK/data: fairseq-pe-prepare-mono on the text folder DATA, whole documents held out, VOCAB
#                          pieces (VALID_PERCENT and TEST_PERCENT, default 1); skipped while WORK/data/train.bin exists
#   once_per_checkpoints WHAT RESULT_DIR RESULT LOG CMD...
#                          runs CMD (through run) unless RESULT_DIR/RESULT exists and was made from the same checkpoints
#                          (RESULT_DIR/checkpoints.txt, written after success, holds CHECKPOINTS and ONCE_KEY); then
#                          logs "WHAT already"

catalogue() { PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m fairseq_pe.systems "$@"; }
die() { echo "$PROG: $*" >&2; exit 2; }
log() { echo "[$TAG $(date +%H:%M:%S)] $*" >&2; }

run() {
  local out=$1; shift
  if [[ $DRY_RUN == 1 ]]; then printf '+ %s\n' "$(printf '%q ' "$@")"; return 0; fi
  mkdir -p "${out%/*}"
  if [[ ${RUN_APPEND:-0} == 1 ]]; then
    "$@" >> "$out" 2>&1 || { echo "$PROG: failed, see $out:" >&2; tail -n 30 "$out" >&2; return 1; }
  else
    "$@" > "$out" 2>&1 || { echo "$PROG: failed, see $out:" >&2; tail -n 30 "$out" >&2; return 1; }
  fi
}

declare -A FLAGS=()
read_systems() {
  local name seed
  for name in $SYSTEMS; do
    FLAGS[$name]=$(catalogue flags "$name" 2>/dev/null) \
      || die "SYSTEMS: unknown system '$name'; choose from: $(catalogue names encodings) (or any of: python -m fairseq_pe.systems table)"
  done
  for seed in $SEEDS; do [[ $seed =~ ^[0-9]+$ ]] || die "SEEDS: '$seed' is not a number"; done
}

_train_command() {  # _train_command NAME SEED DIR OPTIONS...: TRAIN_CMD, the run's fairseq-train command
  local name=$1 seed=$2 dir=$3; shift 3
  # shellcheck disable=SC2086
  local pe=(${FLAGS[$name]}) arch_args=(${ARCH_ARGS:-}) every=()
  [[ ${VALIDATE_EVERY:-0} == 0 ]] || every+=(--validate-interval-updates "$VALIDATE_EVERY")
  [[ ${SAVE_EVERY:-0} == 0 ]] || every+=(--save-interval-updates "$SAVE_EVERY" --keep-interval-updates 1)
  TRAIN_CMD=(fairseq-train "$WORK/data" \
    --user-dir "$PLUGIN" --task language_modeling "$@" --arch "$ARCH" ${arch_args[@]+"${arch_args[@]}"} "${pe[@]}" \
    --share-decoder-input-output-embed --dropout 0.1 \
    --optimizer adam --adam-betas '(0.9, 0.98)' --weight-decay 0.01 --clip-norm 0.0 \
    --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --warmup-init-lr 1e-07 \
    --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --seed "$seed" --cpu --num-workers 0 \
    --save-dir "$dir" --no-epoch-checkpoints --log-format simple ${every[@]+"${every[@]}"})
}

_train_one() {  # _train_one NAME SEED DIR RESUME OPTIONS...
  local name=$1 seed=$2 dir=$3 resume=$4 start=$SECONDS; shift 4
  _train_command "$name" "$seed" "$dir" "$@"
  [[ $DRY_RUN == 1 ]] || { mkdir -p "$dir"; printf '%q ' "${TRAIN_CMD[@]}" > "$dir/train.cmd"; }
  OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS RUN_APPEND=$resume run "$dir/train.log" "${TRAIN_CMD[@]}"
  [[ $DRY_RUN == 1 ]] && return 0
  touch "$dir/train.done"
  log "$name seed $seed: trained in $((SECONDS - start)) s ($(grep -o 'done training in [0-9.]* seconds' "$dir/train.log"))"
}

prepare_data() {  # WORK/data from the text folder DATA, whole documents held out (skipped while train.bin is there)
  # the step runs while train.bin, which the tool writes last, is missing: --force replaces what an interrupted
  # earlier run left
  [[ $DRY_RUN == 1 || -d $DATA ]] || die "text folder $DATA not found; set DATA=DIR (*.txt / *.raw files under it)"
  if [[ -f $WORK/data/train.bin ]]; then
    log "reusing the data in $WORK/data"
    return 0
  fi
  log "preparing $DATA -> $WORK/data (whole documents held out)"
  run "$WORK/logs/prepare.log" fairseq-pe-prepare-mono --input "$DATA" --destdir "$WORK/data" --vocab-size "$VOCAB" \
    --split documents --valid-percent "${VALID_PERCENT:-1}" --test-percent "${TEST_PERCENT:-1}" --workers 2 --force
  [[ $DRY_RUN == 1 ]] || grep -E '^\[prepare-mono' "$WORK/logs/prepare.log" | sed -n '2,4p' >&2
}

_resumable() {  # _resumable DIR: DIR/checkpoint_last.pt loads (safely: no code of the file runs); else the newest interval
  # checkpoint that loads takes its place (fairseq writes that one atomically, then copies it to checkpoint_last.pt:
  # a run killed during the copy leaves a truncated checkpoint_last.pt); status 1 when none loads
  PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$1" <<'PY'
import glob, os, shutil, sys
from fairseq_pe.safe_load import load

folder = sys.argv[1]
last = os.path.join(folder, "checkpoint_last.pt")


def loads(path):
    try:
        load(path, "a checkpoint to resume from")
        return True
    except Exception:
        return False


if os.path.exists(last) and loads(last):
    sys.exit(0)
for path in sorted(glob.glob(os.path.join(folder, "checkpoint_*_*.pt")), key=os.path.getmtime, reverse=True):
    if loads(path):
        shutil.copyfile(path, last + ".part")
        os.replace(last + ".part", last)
        print(f"{last} did not load: resuming from {path}", file=sys.stderr)
        sys.exit(0)
sys.exit(1)
PY
}

CHECKPOINTS=()
train_systems() {
  local desc=$1 name seed dir pending=0; shift
  for seed in $SEEDS; do
    for name in $SYSTEMS; do
      dir=$WORK/runs/$name-s$seed
      CHECKPOINTS+=("$name=$dir/checkpoint_last.pt")
      if [[ $DRY_RUN != 1 && -f $dir/train.done ]]; then
        log "$name seed $seed: trained already ($dir)"
        continue
      fi
      local resume=0
      if [[ $DRY_RUN != 1 && -d $dir ]]; then  # interrupted: resumed where its command is the same, else again
        _train_command "$name" "$seed" "$dir" "$@"
        if [[ -f $dir/train.cmd && $(cat "$dir/train.cmd") == "$(printf '%q ' "${TRAIN_CMD[@]}")" ]] && _resumable "$dir"; then
          resume=1
          log "$name seed $seed: resuming from $dir/checkpoint_last.pt"
        else
          rm -rf "$dir"
        fi
      fi
      log "$name seed $seed: training ($ARCH ${FLAGS[$name]}, $desc)"
      if [[ $DRY_RUN == 1 || $JOBS -le 1 ]]; then
        _train_one "$name" "$seed" "$dir" "$resume" "$@"
      else
        _train_one "$name" "$seed" "$dir" "$resume" "$@" &
        pending=$((pending + 1))
        if ((pending >= JOBS)); then wait -n; pending=$((pending - 1)); fi
      fi
    done
  done
  while ((pending > 0)); do wait -n; pending=$((pending - 1)); done
}

once_per_checkpoints() {
  local what=$1 dir=$2 result=$3 out=$4; shift 4
  local list
  list=$(printf '%s\n' "${CHECKPOINTS[@]}" ${ONCE_KEY+"$ONCE_KEY"})
  if [[ $DRY_RUN != 1 && -f $dir/$result && $(cat "$dir/checkpoints.txt" 2>/dev/null) == "$list" ]]; then
    log "$what already: $dir/$result"
    return 0
  fi
  run "$out" "$@"
  [[ $DRY_RUN == 1 ]] || printf '%s\n' "$list" > "$dir/checkpoints.txt"
}
