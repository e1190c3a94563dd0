# shellcheck shell=bash
# Shared functions of the FLOATER recipes in scripts/recipes/ (sourced, not run).
#
# What it provides: data preparation (fairseq-pe-prepare-wmt14, fairseq-pe-s2l-split), training with
# the Transformer hyper-parameters of Vaswani et al. (2017) as fairseq's "Scaling NMT" example sets them
# (Adam β=(0.9,0.98), inverse-sqrt schedule with 4,000 warm-up updates, label smoothing 0.1,
# dropout 0.1 base / 0.3 big En-De / 0.1 big En-Fr, shared embeddings, ≈25k source + 25k target
# tokens per update), FLOATER's warm start (fairseq-pe-warm-start-floater, then fine-tuning),
# checkpoint averaging (fairseq-pe-average-checkpoints), decoding (beam 4, length
# penalty 0.6, max length = source + 50) and scoring (fairseq-pe-bucket-bleu: sacreBLEU and the
# papers' tokenised, compound-split BLEU, per source-length bucket, with a PNG).
#
# Every step is skipped when its output exists (a marker written after success), so a recipe that
# was interrupted is resumed by running it again; fairseq-train itself resumes from
# checkpoint_last.pt.
#
# Environment variables (all optional):
#   DRY_RUN=1              print every command (one per line, "+ " prefixed, shell-quoted) instead of
#                          running it; needs no data, no GPU and nothing but bash and python
#   DATA_ROOT              prepared corpora (default ./floater-data): DATA_ROOT/wmt14-en-de,
#                          DATA_ROOT/wmt14-en-fr, DATA_ROOT/s2l-en-de
#   RAW_DIR                already downloaded WMT14 archives/files (fairseq-pe-prepare-wmt14 --raw-dir)
#   OUT_ROOT               checkpoints, translations and result tables (default ./floater-runs)
#   MAX_UPDATE             training updates (default 100000 base, 300000 big, as Vaswani et al.)
#   FINETUNE_UPDATES       FLOATER warm-start fine-tuning updates (default 20000, ≈ 3-4 epochs of
#                          WMT14 En-De: the paper says "a few more epochs"); FINETUNE_WARMUP (1000)
#   FINETUNE_LR            fine-tuning learning rate (default: the pre-training schedule's rate at its
#                          last update, lr·sqrt(warmup/MAX_UPDATE); constant after 1,000 warm-up updates)
#   FLOATER_LR_SCALE       --pe-floater-lr-scale for the FLOATER dynamics (default: not set, i.e. 1)
#   NUM_GPUS               GPUs fairseq-train will use (default: torch.cuda.device_count(); 1 in DRY_RUN).
#                          fairseq-train uses every visible GPU: restrict with CUDA_VISIBLE_DEVICES
#   MAX_TOKENS             tokens per GPU per batch (default 4096)
#   TOKENS_PER_UPDATE      target tokens per update over all GPUs (default 32768 = 8 GPUs × 4096,
#                          ≈ 25k real tokens per side after padding, as Vaswani et al.)
#   UPDATE_FREQ            gradient accumulation (default ceil(TOKENS_PER_UPDATE / (MAX_TOKENS·NUM_GPUS)))
#   LR, WARMUP, DROPOUT    override the defaults (lr 7e-4 base / 5e-4 big; 4000; see above)
#   SAVE_INTERVAL_UPDATES  checkpoint every N updates (default 2000); KEEP_INTERVAL_UPDATES (default 10)
#   AVG_N                  checkpoints averaged by fairseq-pe-average-checkpoints (default 5 base, 10 big;
#                          AVG_N=1 decodes checkpoint_last.pt without averaging)
#   PRECISION              fp16 (default on GPU), bf16 or fp32
#   SEED                   (default 1)
#   SYSTEMS                space-separated subset of a recipe's systems to run (default: all)
#   TRAIN_EXTRA            more fairseq-train flags for every run (one string, word-split)
#   GEN_MAX_TOKENS         fairseq-generate --max-tokens (default 8192)
#   WORKERS                preprocessing workers (default: the tools' defaults)
#   PLUGIN                 the fairseq_pe package directory passed as --user-dir (default: the
#                          installed package, found without importing it)
#   ALLOW_CPU=1            run without a GPU (adds --cpu; only sensible for smoke tests)
#   PYTHON                 the interpreter with fairseq and fairseq_pe (default: python)

case ${BASH_SOURCE[0]} in */*) RECIPES_DIR=${BASH_SOURCE[0]%/*} ;; *) RECIPES_DIR=. ;; esac
RECIPES_DIR=$(cd "$RECIPES_DIR" && pwd)
DRY_RUN=${DRY_RUN:-0}
DATA_ROOT=${DATA_ROOT:-$PWD/floater-data}
OUT_ROOT=${OUT_ROOT:-$PWD/floater-runs}
SEED=${SEED:-1}
MAX_TOKENS=${MAX_TOKENS:-4096}
TOKENS_PER_UPDATE=${TOKENS_PER_UPDATE:-32768}
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-2000}
KEEP_INTERVAL_UPDATES=${KEEP_INTERVAL_UPDATES:-10}
GEN_MAX_TOKENS=${GEN_MAX_TOKENS:-8192}
FINETUNE_UPDATES=${FINETUNE_UPDATES:-20000}
FINETUNE_WARMUP=${FINETUNE_WARMUP:-1000}
PYTHON=${PYTHON:-python}

# ----------------------------------------------------------------------------------------------
# printing and running

log() { echo "[recipe] $*" >&2; }
die() { echo "[recipe] error: $*" >&2; exit 1; }
dry() { [[ $DRY_RUN == 1 ]]; }

# _quote ARG: sets REPLY to ARG, quoted only when the shell needs it (printed commands can be pasted)
_quote() {
    if [[ $1 =~ ^[A-Za-z0-9_./:=,+@%^-]+$ ]]; then
        REPLY=$1
    else
        local sq="'" esc="'\\''"
        REPLY="'${1//$sq/$esc}'"
    fi
}
# show CMD...: print the command (with SHOW_SUFFIX appended, e.g. a redirection)
show() {
    local out="+" a
    for a in "$@"; do
        _quote "$a"
        out+=" $REPLY"
    done
    printf '%s%s\n' "$out" "${SHOW_SUFFIX:-}"
}
# run CMD...: print it, then run it (print only with DRY_RUN=1)
run() {
    show "$@"
    dry || "$@"
}
# run_logged LOG CMD...: print, run with stdout+stderr appended to LOG (and shown)
run_logged() {
    local logfile=$1; shift
    _quote "$logfile"
    SHOW_SUFFIX=" 2>&1 | tee -a $REPLY" show "$@"
    dry && return 0
    mkdir -p "${logfile%/*}"
    "$@" 2>&1 | tee -a "$logfile"
}
# run_to OUT CMD...: print, run with stdout to OUT (written to OUT.part, renamed on success)
run_to() {
    local out=$1; shift
    _quote "$out"
    SHOW_SUFFIX=" > $REPLY" show "$@"
    dry && return 0
    mkdir -p "${out%/*}"
    "$@" > "$out.part"
    mv "$out.part" "$out"
}
# a step is done when its marker exists (never in DRY_RUN: every command is printed)
is_done() { ! dry && [[ -e $1 ]]; }
mark_done() { dry || { mkdir -p "${1%/*}" && date > "$1"; }; }

# ----------------------------------------------------------------------------------------------
# the named systems: the catalogue fairseq_pe/systems.py of this checkout, the only list of them

_CATALOGUE_REPO=${BASH_SOURCE[0]%/*}/../..
catalogue() { PYTHONPATH="$_CATALOGUE_REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m fairseq_pe.systems "$@"; }

# catalogue_group GROUP: FROM_SCRATCH = the group's names, FLAGS[NAME] = their --pe-* flags (declare -A FLAGS first)
catalogue_group() {
    local out name flags
    out=$(catalogue group "$1") || die "fairseq_pe/systems.py has no group $1 (or $PYTHON cannot import it)"
    FROM_SCRATCH=()
    while read -r name flags; do
        FROM_SCRATCH+=("$name")
        FLAGS[$name]=$flags
    done <<< "$out"
}

# ----------------------------------------------------------------------------------------------
# environment

# PLUGIN (fairseq_pe's directory) and FAIRSEQ_PKG (fairseq's), found with one python call that
# imports neither (importing fairseq takes seconds)
_locate_packages() {
    [[ -n ${_LOCATED:-} ]] && return 0
    _LOCATED=1
    local out
    out=$("$PYTHON" -c 'import importlib.util, os
for name in ("fairseq_pe", "fairseq"):
    s = importlib.util.find_spec(name)
    print(os.path.dirname(s.origin) if s and s.origin else "-")' 2>/dev/null || true)
    local lines=()
    mapfile -t lines <<< "$out"
    [[ ${lines[0]:--} != - ]] && _PLUGIN_FOUND=${lines[0]}
    [[ ${lines[1]:--} != - ]] && FAIRSEQ_PKG=${lines[1]}
    return 0
}

find_plugin() {
    [[ -n ${PLUGIN:-} ]] && return 0
    _locate_packages
    PLUGIN=${_PLUGIN_FOUND:-}
    if [[ -z $PLUGIN && -d $RECIPES_DIR/../../fairseq_pe ]]; then
        PLUGIN=$(cd "$RECIPES_DIR/../../fairseq_pe" && pwd)
    fi
    [[ -n $PLUGIN ]] || die "cannot find the fairseq_pe package: install it (bash scripts/install.sh) or set PLUGIN"
}


# GPUs, precision and batch size
setup_hardware() {
    if [[ -z ${NUM_GPUS:-} ]]; then
        if dry; then
            NUM_GPUS=1
        else
            NUM_GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
        fi
    fi
    CPU_FLAGS=()
    if [[ $NUM_GPUS -lt 1 ]]; then
        [[ ${ALLOW_CPU:-0} == 1 ]] || die "no CUDA GPU is visible (torch.cuda.device_count() = 0). These recipes train WMT14 Transformers; set ALLOW_CPU=1 to run on the CPU anyway"
        CPU_FLAGS=(--cpu)
        NUM_GPUS=1
        PRECISION=${PRECISION:-fp32}
    fi
    PRECISION=${PRECISION:-fp16}
    case $PRECISION in
        fp16) PREC_FLAGS=(--fp16) ;;
        bf16) PREC_FLAGS=(--bf16) ;;
        fp32) PREC_FLAGS=() ;;
        *) die "PRECISION=$PRECISION: use fp16, bf16 or fp32" ;;
    esac
    if [[ -z ${UPDATE_FREQ:-} ]]; then
        local per=$((MAX_TOKENS * NUM_GPUS))
        UPDATE_FREQ=$(((TOKENS_PER_UPDATE + per - 1) / per))
    fi
}

# ARCH, LR, DROPOUT, MAX_UPDATE, AVG_N for a model size and language pair
setup_model() {
    local size=$1 pair=$2
    SRC=${pair%-*}
    TGT=${pair#*-}
    case $size in
        base)
            ARCH=transformer_pe_wmt_en_de
            LR=${LR:-0.0007}
            DROPOUT=${DROPOUT:-0.1}
            MAX_UPDATE=${MAX_UPDATE:-100000}
            AVG_N=${AVG_N:-5}
            ;;
        big)
            if [[ $pair == en-fr ]]; then
                ARCH=transformer_pe_vaswani_wmt_en_fr_big
                DROPOUT=${DROPOUT:-0.1}
            else
                ARCH=transformer_pe_vaswani_wmt_en_de_big
                DROPOUT=${DROPOUT:-0.3}
            fi
            LR=${LR:-0.0005}
            MAX_UPDATE=${MAX_UPDATE:-300000}
            AVG_N=${AVG_N:-10}
            ;;
        *) die "model size '$size': use base or big" ;;
    esac
    WARMUP=${WARMUP:-4000}
    if [[ -z ${FINETUNE_LR:-} ]]; then
        FINETUNE_LR=$("$PYTHON" -c "import math; print('%.3g' % ($LR * math.sqrt(min(1.0, $WARMUP / $MAX_UPDATE))))")
    fi
}

# check everything a real run needs before hours of training; with DRY_RUN only warn
preflight() {
    find_plugin
    setup_hardware
    local missing=() t
    for t in "$@"; do
        command -v "$t" >/dev/null 2>&1 || missing+=("$t")
    done
    if ((${#missing[@]})); then
        if dry; then
            log "warning: not on PATH (fine for DRY_RUN): ${missing[*]}"
        else
            die "not on PATH: ${missing[*]} (install the package: bash scripts/install.sh)"
        fi
    fi
    log "plugin $PLUGIN | $NUM_GPUS GPU(s) | max-tokens $MAX_TOKENS × update-freq $UPDATE_FREQ × $NUM_GPUS GPU(s) = $((MAX_TOKENS * UPDATE_FREQ * NUM_GPUS)) tokens/update | ${PREC_FLAGS[*]:-fp32} | DRY_RUN=$DRY_RUN"
}

# is NAME among SYSTEMS (default: every system)
selected() {
    [[ -z ${SYSTEMS:-} ]] && return 0
    [[ " $SYSTEMS " == *" $1 "* ]]
}

# ----------------------------------------------------------------------------------------------
# data

# prepare_wmt14 PAIR: sets WMT_DIR (raw/, spm/spm.model, data-bin/)
prepare_wmt14() {
    local pair=$1
    WMT_DIR=$DATA_ROOT/wmt14-$pair
    local cmd=(fairseq-pe-prepare-wmt14 --pair "$pair" --workdir "$WMT_DIR")
    [[ -n ${RAW_DIR:-} ]] && cmd+=(--raw-dir "$RAW_DIR")
    [[ -n ${WORKERS:-} ]] && cmd+=(--workers "$WORKERS")
    if is_done "$WMT_DIR/.done/binarise"; then
        log "WMT14 $pair: prepared already ($WMT_DIR)"
    else
        run "${cmd[@]}"
    fi
}

# prepare_s2l: the S2L split of WMT14 En-De's training data; sets S2L_DIR
prepare_s2l() {
    prepare_wmt14 en-de
    S2L_DIR=$DATA_ROOT/s2l-en-de
    local cmd=(fairseq-pe-s2l-split --corpus "$WMT_DIR/raw/train" --source-lang en --target-lang de
        --out "$S2L_DIR" --spm-model "$WMT_DIR/spm/spm.model" --unit subword --threshold 80
        --bins 80,100,120,140+ --valid-size 1000 --binarize --force)  # --force: an interrupted earlier split
    [[ -n ${WORKERS:-} ]] && cmd+=(--workers "$WORKERS")
    if is_done "$S2L_DIR/.recipe-done"; then
        log "S2L split: prepared already ($S2L_DIR)"
    else
        run "${cmd[@]}"
        mark_done "$S2L_DIR/.recipe-done"
    fi
}

# ----------------------------------------------------------------------------------------------
# training

# optimisation flags: opt_flags MAX_UPDATE LR SCHEDULER WARMUP
opt_flags() {
    local max_update=$1 lr=$2 scheduler=$3 warmup=$4
    OPT_FLAGS=(--optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0
        --lr "$lr" --lr-scheduler "$scheduler" --warmup-updates "$warmup"
        --weight-decay 0.0 --dropout "$DROPOUT"
        --criterion label_smoothed_cross_entropy --label-smoothing 0.1
        --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-update "$max_update"
        --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-interval-updates "$KEEP_INTERVAL_UPDATES"
        --no-epoch-checkpoints --seed "$SEED" --log-format simple --log-interval 100
        "${PREC_FLAGS[@]}" "${CPU_FLAGS[@]}")
    # fairseq's fixed schedule warms up from 0 and has no --warmup-init-lr
    [[ $scheduler == inverse_sqrt ]] && OPT_FLAGS+=(--warmup-init-lr 1e-07)
    # shellcheck disable=SC2206
    [[ -n ${TRAIN_EXTRA:-} ]] && OPT_FLAGS+=($TRAIN_EXTRA)
    return 0
}

# _fairseq_train NAME DATA_BIN MAX_UPDATE [model and extra flags...]: one run in RUN_DIR/NAME
_fairseq_train() {
    local name=$1 data=$2 max_update=$3; shift 3
    local dir=$RUN_DIR/$name
    if is_done "$dir/.trained"; then
        log "$name: trained already ($dir)"
        return 0
    fi
    run_logged "$dir/train.log" fairseq-train "$data" --user-dir "$PLUGIN" --task translation \
        --source-lang "$SRC" --target-lang "$TGT" --arch "$ARCH" --share-all-embeddings \
        "$@" "${OPT_FLAGS[@]}" --save-dir "$dir"
    mark_done "$dir/.trained"
}

# train NAME DATA_BIN [--pe-* flags...]: from scratch, the full schedule
train() {
    local name=$1 data=$2; shift 2
    opt_flags "$MAX_UPDATE" "$LR" inverse_sqrt "$WARMUP"
    _fairseq_train "$name" "$data" "$MAX_UPDATE" "$@"
}

# finetune NAME DATA_BIN INIT_CHECKPOINT [--pe-* flags...]: FINETUNE_UPDATES more updates from INIT
# (--finetune-from-model: a fresh optimizer as --restore-file INIT --reset-optimizer, but a re-run
# resumes from NAME's own checkpoint_last.pt instead of starting again from INIT)
finetune() {
    local name=$1 data=$2 init=$3; shift 3
    opt_flags "$FINETUNE_UPDATES" "$FINETUNE_LR" fixed "$FINETUNE_WARMUP"
    _fairseq_train "$name" "$data" "$FINETUNE_UPDATES" --finetune-from-model "$init" "$@"
}

# warm_start SOURCE_NAME NAME DATA_BIN [--pe-* flags of SOURCE...]: FLOATER's schedule (§3.3, §4.4):
# convert SOURCE's last checkpoint into a FLOATER Q/K/V-bias model (exact at conversion), then
# fine-tune it with SOURCE's flags + --pe-floater-bias, the flags the converter prints (--force: INIT.part is
# this recipe's own, left by an interrupted earlier run)
warm_start() {
    local src=$1 name=$2 data=$3; shift 3
    local dir=$RUN_DIR/$name
    local init=$dir/floater_init.pt
    local flags=("$@" --pe-floater-bias)
    [[ -n ${FLOATER_LR_SCALE:-} ]] && flags+=(--pe-floater-lr-scale "$FLOATER_LR_SCALE")
    if is_done "$init"; then
        log "$name: converted already ($init)"
    else
        run_logged "$dir/convert.log" fairseq-pe-warm-start-floater "$RUN_DIR/$src/checkpoint_last.pt" "$init.part" \
            --data "$data" --force
        run mv "$init.part" "$init"
        if ! dry; then  # the converter prints the fine-tuning flags: they must agree with ours
            local want
            want=$(grep -o -- '--pe-absolute [a-z-]*' "$dir/convert.log" | tail -n 1)
            [[ " ${flags[*]} " == *" $want "* ]] || die "$name: the converter asks for '$want', the recipe passes '${flags[*]}'"
        fi
    fi
    finetune "$name" "$data" "$init" "${flags[@]}"
}

# ----------------------------------------------------------------------------------------------
# evaluation

# checkpoint_path NAME [UPDATES]: sets CKPT to the checkpoint that is decoded: the average of NAME's
# last AVG_N interval checkpoints (fewer when fewer are kept), or checkpoint_last.pt
checkpoint_path() {
    local name=$1 updates=${2:-$MAX_UPDATE}
    local dir=$RUN_DIR/$name
    AVG_K=$AVG_N
    local saved=$((updates / SAVE_INTERVAL_UPDATES))
    ((saved < KEEP_INTERVAL_UPDATES)) || saved=$KEEP_INTERVAL_UPDATES
    ((AVG_K <= saved)) || AVG_K=$saved
    if ((AVG_K < 2)); then
        CKPT=$dir/checkpoint_last.pt
    else
        CKPT=$dir/checkpoint.avg$AVG_K.pt
    fi
}

# average NAME [UPDATES]: average NAME's last checkpoints with fairseq's script; sets CKPT
average() {
    local name=$1
    checkpoint_path "$@"
    [[ $CKPT == */checkpoint_last.pt ]] && return 0
    if is_done "$CKPT"; then
        log "$name: averaged already ($CKPT)"
        return 0
    fi
    # written atomically: an interrupted run leaves no half checkpoint
    run fairseq-pe-average-checkpoints --inputs "$RUN_DIR/$name" --num-update-checkpoints "$AVG_K" \
        --output "$CKPT"
}

# generate NAME DATA_BIN CHECKPOINT: translations of the test subset into RUN_DIR/NAME/generate-test.txt
generate() {
    local name=$1 data=$2 ckpt=$3
    GEN_OUT=$RUN_DIR/$name/generate-test.txt
    if is_done "$GEN_OUT"; then
        log "$name: decoded already ($GEN_OUT)"
        return 0
    fi
    run_to "$GEN_OUT" fairseq-generate "$data" --user-dir "$PLUGIN" --task translation \
        --source-lang "$SRC" --target-lang "$TGT" --path "$ckpt" --gen-subset test \
        --beam 4 --lenpen 0.6 --max-len-a 1 --max-len-b 50 \
        --max-source-positions 4096 --max-target-positions 4096 \
        --max-tokens "$GEN_MAX_TOKENS" --required-batch-size-multiple 1 \
        --post-process sentencepiece "${PREC_FLAGS[@]}" "${CPU_FLAGS[@]}"
}

# evaluate NAME DATA_BIN [UPDATES]: average, then decode; appends NAME=output to SCORED and
# NAME=checkpoint to LOSS_SYSTEMS
SCORED=()
LOSS_SYSTEMS=()
evaluate() {
    local name=$1 data=$2 updates=${3:-$MAX_UPDATE}
    average "$name" "$updates"
    generate "$name" "$data" "$CKPT"
    SCORED+=(--system "$name=$GEN_OUT")
    LOSS_SYSTEMS+=(--system "$name=$CKPT")
}

# score PREFIX TITLE BUCKETS SOURCE REFERENCE SPM [more fairseq-pe-bucket-bleu flags]: one table + PNG
# of every system in SCORED (sacreBLEU and tokenised compound-split BLEU per bucket); a re-run scores again
# (--force: replaces the table of the earlier run)
score() {
    local prefix=$1 title=$2 buckets=$3 source=$4 ref=$5 spm=$6; shift 6
    ((${#SCORED[@]})) || die "no system to score (SYSTEMS='${SYSTEMS:-}')"
    dry || mkdir -p "${prefix%/*}"
    run fairseq-pe-bucket-bleu "${SCORED[@]}" --source "$source" --reference "$ref" \
        --spm-model "$spm" --unit subword --buckets "$buckets" --tokenized-bleu "$TGT" \
        --title "$title" --out "$prefix" --force "$@"
}

# score_loss PREFIX TITLE BUCKETS DATA_BIN: the teacher-forced loss of the test references per source-length
# bucket (source sentencepiece tokens, as score's) and per target position, of every system in LOSS_SYSTEMS
# (fairseq-pe-bucket-loss: table, JSON, PNG); a sentence beyond a learned table is counted in its own column
score_loss() {
    local prefix=$1 title=$2 buckets=$3 data=$4
    ((${#LOSS_SYSTEMS[@]})) || die "no system to score (SYSTEMS='${SYSTEMS:-}')"
    dry || mkdir -p "${prefix%/*}"
    run fairseq-pe-bucket-loss "$data" "${LOSS_SYSTEMS[@]}" --gen-subset test --unit token --buckets "$buckets" \
        --beyond-table report --title "$title" --out "$prefix" --force "${CPU_FLAGS[@]}"
}

# Train every selected system of FROM_SCRATCH (flags in the associative array FLAGS), then the
# warm-started FLOATER (floater-ws) and its control (ape-sinusoidal-cont) from ape-sinusoidal's
# checkpoint (trained as well when NEED_SIN=1), then decode all of them.  Uses the globals
# FROM_SCRATCH, FLAGS, NEED_SIN, RUN_DIR and FINETUNE_UPDATES of the calling recipe.
train_and_evaluate_all() {
    local DATA=$1 name
    for name in "${FROM_SCRATCH[@]}"; do
        if selected "$name" || { [[ $name == ape-sinusoidal ]] && ((NEED_SIN)); }; then
            # shellcheck disable=SC2086
            train "$name" "$DATA" ${FLAGS[$name]}
        fi
    done
    if selected floater-ws; then
        # shellcheck disable=SC2086
        warm_start ape-sinusoidal floater-ws "$DATA" ${FLAGS[ape-sinusoidal]}
    fi
    if selected ape-sinusoidal-cont; then
        # shellcheck disable=SC2086
        finetune ape-sinusoidal-cont "$DATA" "$RUN_DIR/ape-sinusoidal/checkpoint_last.pt" ${FLAGS[ape-sinusoidal]}
    fi

    for name in "${FROM_SCRATCH[@]}"; do
        if selected "$name"; then evaluate "$name" "$DATA"; fi
    done
    if selected floater-ws; then evaluate floater-ws "$DATA" "$FINETUNE_UPDATES"; fi
    if selected ape-sinusoidal-cont; then evaluate ape-sinusoidal-cont "$DATA" "$FINETUNE_UPDATES"; fi
}
