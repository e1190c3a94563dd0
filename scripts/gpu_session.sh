#!/usr/bin/env bash
# The GPU machine's one command: install (offline, when needed), the GPU check under its budget, then, with the
# time left, the benchmark of the systems that matter most.  docs/install.md ("A GPU acceptance check") says more.
#
#   bash scripts/gpu_session.sh OUT                       # on the GPU machine (default budgets below)
#   bash scripts/gpu_session.sh OUT --device cpu          # the CPU rehearsal (CI: tests/test_gpu_check.py)
#
# Options:
#   --device cuda|cpu    default cuda
#   --budget SECONDS     the checks' budget (fairseq-pe-gpu-check --budget; default 420 on cuda, 150 on cpu)
#   --total SECONDS      the whole command, install and benchmark included (default 570: a command may run 600 s
#                        on the lent machines); the benchmark runs only when at least BENCHMARK_MIN (150) s are left
#   --wheelhouse DIR     the folder of wheels for the offline install (default: wheelhouse, when fairseq_pe does
#                        not import yet); built beforehand where PyPI is reachable (docs/install.md)
#   --no-install         never install (fairseq_pe must import with $PYTHON)
#   --no-benchmark       the checks only
#   --force              replace the results of an earlier session in OUT
#   --systems NAME...    passed to fairseq-pe-gpu-check (and nothing else may follow it)
#
# The Python: $PYTHON, else /opt/torch/.venv/bin/python3 where that exists (the lent machines' torch), else
# python3; the tools run as its modules (python -m fairseq_pe.benchmark.gpu_check, python -m fairseq_pe.benchmark):
# the folder where pip puts their console scripts need not be on PATH.  Writes OUT/gpu_check.{json,md} (after every
# check), OUT/gpu_check.txt (the table), OUT/install.log, OUT/benchmark/ and OUT/session.txt (what ran, how long, exit
# statuses).  Progress goes to stderr.
# Exit status: 1 when the install failed, a check failed or the benchmark failed; 0 otherwise; 2 for a usage error.
set -uo pipefail
usage="usage: bash scripts/gpu_session.sh OUT [--device cuda|cpu] [--budget S] [--total S] [--wheelhouse DIR] [--no-install] [--no-benchmark] [--force] [--systems NAME...]"
BENCHMARK_MIN=150
#: the benchmark's systems (stock is always measured): the widely used encodings and one per attention path
BENCHMARK_SYSTEMS=(ape-sinusoidal rope t5 rpe-learned)
start=$SECONDS
out= device=cuda budget= total=570 wheelhouse= install=auto benchmark=1 force=0 systems=()
die() { echo "[gpu-session] ERROR: $1 ($usage)" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
    case $1 in
        --device) [[ ${2:-} == cuda || ${2:-} == cpu ]] || die "--device: cuda or cpu"; device=$2; shift 2 ;;
        --budget) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--budget: a number of seconds"; budget=$2; shift 2 ;;
        --total) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--total: a number of seconds"; total=$2; shift 2 ;;
        --wheelhouse) [[ -n ${2:-} ]] || die "--wheelhouse: a folder"; wheelhouse=$2; shift 2 ;;
        --no-install) install=no; shift ;;
        --no-benchmark) benchmark=0; shift ;;
        --force) force=1; shift ;;
        --systems) shift; systems=("$@"); [[ ${#systems[@]} -gt 0 ]] || die "--systems: one name or more"; break ;;
        -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option '$1'" ;;
        *) [[ -z $out ]] || die "one OUT folder, not '$out' and '$1'"; out=$1; shift ;;
    esac
done
[[ -n $out ]] || die "OUT: the folder for the results"
[[ -n $wheelhouse && ! -d $wheelhouse ]] && die "--wheelhouse $wheelhouse: no such folder"
[[ $force == 1 || ! -e $out/gpu_check.json ]] || die "$out holds the results of an earlier session: --force replaces them, or name another OUT"
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x /opt/torch/.venv/bin/python3 ]]; then PYTHON=/opt/torch/.venv/bin/python3; else PYTHON=python3; fi
fi
note() { echo "[gpu-session $(date +%H:%M:%S)] $1" >&2; echo "$1" >> "$out/session.txt"; }
: > "$out/session.txt"
note "python: $PYTHON; device: $device; out: $out"

# 1. install
if [[ $install == auto ]] && "$PYTHON" -c "import fairseq, fairseq_pe" >/dev/null 2>&1; then
    note "install: not needed (fairseq and fairseq_pe import)"
elif [[ $install == no ]]; then
    "$PYTHON" -c "import fairseq, fairseq_pe" >/dev/null 2>&1 || { note "install: --no-install, and fairseq_pe does not import with $PYTHON"; exit 1; }
    note "install: --no-install"
else
    wheelhouse=${wheelhouse:-wheelhouse}
    if [[ ! -d $wheelhouse ]]; then
        note "install: fairseq_pe does not import and there is no folder of wheels '$wheelhouse': build it where PyPI is reachable (python scripts/build_wheelhouse.py --python-version 3.12 --have scripts/wheelhouse/gpu-machine-have.txt --out wheelhouse) and bring it along"
        exit 1
    fi
    t=$SECONDS
    if ! PYTHON=$PYTHON bash scripts/install.sh --wheelhouse "$wheelhouse" > "$out/install.log" 2>&1; then
        tail -n 20 "$out/install.log" >&2
        note "install: failed after $((SECONDS - t)) s (OUT/install.log)"
        exit 1
    fi
    PYTHON=$("$PYTHON" scripts/python_env.py)  # the interpreter install.sh installed into
    note "install: $((SECONDS - t)) s from $wheelhouse ($(tail -n 1 "$out/install.log"))"
fi
if [[ $device == cuda ]] && ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    note "no CUDA device is visible to $PYTHON (torch.cuda.is_available() is False): nothing checked (--device cpu for the rehearsal)"
    exit 1
fi

# 2. the checks
args=(--device "$device" --out "$out" --force)
[[ -n $budget ]] && args+=(--budget "$budget")
[[ ${#systems[@]} -gt 0 ]] && args+=(--systems "${systems[@]}")
t=$SECONDS
"$PYTHON" -m fairseq_pe.benchmark.gpu_check "${args[@]}" > "$out/gpu_check.txt"
check_status=$?
cat "$out/gpu_check.txt"
note "checks: exit status $check_status after $((SECONDS - t)) s (OUT/gpu_check.md, OUT/gpu_check.json)"

# 3. the benchmark, with the time left
bench_status=0
left=$((total - (SECONDS - start)))
bench_args=(--out "$out/benchmark" --force --device cuda --fp16 --size iwslt --systems "${BENCHMARK_SYSTEMS[@]}"
            --repeats 1 --lengths 1024 4096)
bench=("$PYTHON" -m fairseq_pe.benchmark "${bench_args[@]}")
if [[ $benchmark == 0 ]]; then
    note "benchmark: --no-benchmark"
elif [[ $device != cuda ]]; then
    note "benchmark: CUDA only (on the GPU machine: fairseq-pe-benchmark ${bench_args[*]})"
elif (( left < BENCHMARK_MIN )); then
    note "benchmark: not run, $left s left (it needs $BENCHMARK_MIN); run it as a command of its own: fairseq-pe-benchmark ${bench_args[*]}"
else
    t=$SECONDS
    timeout --signal INT --kill-after 10 "$((left - 5))" "${bench[@]}" > "$out/benchmark.txt" 2>&1
    bench_status=$?
    tail -n 40 "$out/benchmark.txt"
    if [[ $bench_status == 124 || $bench_status == 130 ]]; then
        note "benchmark: stopped at the end of the time ($((SECONDS - t)) s; OUT/benchmark.txt)"
        bench_status=0
    else
        note "benchmark: exit status $bench_status after $((SECONDS - t)) s (OUT/benchmark/benchmark.md)"
    fi
fi
note "session: $((SECONDS - start)) s"
if [[ $check_status != 0 ]]; then exit 1; fi
if [[ $bench_status != 0 ]]; then exit 1; fi
exit 0
