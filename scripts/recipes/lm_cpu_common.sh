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
#                          NAME=.../checkpoint_last.pt
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
  "$@" > "$out" 2>&1 || { echo "$PROG: failed, see $out:" >&2; tail -n 30 "$out" >&2; return 1; }
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

_train_one() {  # _train_one NAME SEED DIR OPTIONS...
  local name=$1 seed=$2 dir=$3 start=$SECONDS; shift 3
  # shellcheck disable=SC2086
  local pe=(${FLAGS[$name]})
  OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS run "$dir/train.log" fairseq-train "$WORK/data" \
    --user-dir "$PLUGIN" --task language_modeling "$@" --arch "$ARCH" "${pe[@]}" \
    --share-decoder-input-output-embed --dropout 0.1 \
    --optimizer adam --adam-betas '(0.9, 0.98)' --weight-decay 0.01 --clip-norm 0.0 \
    --lr "$LR" --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --warmup-init-lr 1e-07 \
    --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --seed "$seed" --cpu --num-workers 0 \
    --save-dir "$dir" --no-epoch-checkpoints --log-format simple
  [[ $DRY_RUN == 1 ]] && return 0
  touch "$dir/train.done"
  log "$name seed $seed: trained in $((SECONDS - start)) s ($(grep -o 'done training in [0-9.]* seconds' "$dir/train.log"))"
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
      [[ $DRY_RUN == 1 ]] || rm -rf "$dir"  # an interrupted run starts again (its learning-rate schedule and seed)
      log "$name seed $seed: training ($ARCH ${FLAGS[$name]}, $desc)"
      if [[ $DRY_RUN == 1 || $JOBS -le 1 ]]; then
        _train_one "$name" "$seed" "$dir" "$@"
      else
        _train_one "$name" "$seed" "$dir" "$@" &
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
