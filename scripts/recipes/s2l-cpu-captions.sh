#!/usr/bin/env bash
# A real-data short-to-long comparison on CPU in which the models translate: the Multi30k image captions
# and the Tatoeba sentences of ../shared/data/mt/en-de (51,111 short, simple En-De pairs).
#
#   bash scripts/recipes/s2l-cpu-captions.sh [WORKDIR] [more fairseq-pe-quickstart flags]
#
# Sources shorter than 20 sentencepiece tokens (the split's joint 6k model, which the models use too) train:
# 42,067 pairs after 1,000 valid and 1,000 "short" test pairs are held back.  The 6,960 longer pairs are
# tested in the bins [20,25), [25,30), [30,40), [40,inf) tokens, so every test source is longer, as the model
# sees it, than every training source (a word threshold would not ensure that: a 15-word caption can have
# 47 tokens).  Every encoding of the quickstart (13; floater-warm: half the updates sinusoidal, then FLOATER) and the
# extrapolation encodings since 2021 (KERPLE log and power, Sandwich, FIRE, xPos, randomised positions [0, 256)
# with the sinusoidal APE and with RoPE),
# transformer_pe_tiny, 1,200 updates of 2,048 tokens (about 6.5 min per run on one core), seeds 1 2 3,
# two runs at a time.
# RoPE context extension at inference: the rope checkpoints are also decoded and scored with Position
# Interpolation, NTK-aware scaling and YaRN (factor ROPE_SCALING_FACTOR, default 4: a source of 4x the
# training length keeps its angles within the trained range; YaRN's original length 37 = the longest training
# target with </s>), through fairseq's --model-overrides and no retraining (rows rope-pi, rope-ntk, rope-yarn;
# ROPE_SCALING_FACTOR=none leaves them out); and with Resonance RoPE's rounded wavelengths on top of YaRN (Wang et al.
# 2024: row rope-yarn-resonance), ReRoPE and Leaky ReRoPE (Su 2023: every relative distance past a window of
# REROPE_WINDOW = 16 positions, under the 19 of the longest training source, capped, or grown 16 times slower; the
# queries' log scaling from the training length 37; rows rope-rerope, rope-leaky-rerope; REROPE_WINDOW=none leaves
# them out).
# The encodings of 2024-2025 (issue 43) beside RoPE, ALiBi and KERPLE as anchors: the catalogue's group
# s2l-cpu-captions-2024,
#   SYSTEMS="$(python -m fairseq_pe.systems names s2l-cpu-captions-2024)" bash scripts/recipes/s2l-cpu-captions.sh WORK
# Randomised positions evaluated two ways: the decoder at 0..n-1 (the default; rows ape-sinusoidal-random,
# rope-random) and at the positions that training draws on average for a target as long as the source (rows
# *-spaced: --pe-random-eval-decoder spaced through --model-overrides, the same checkpoints).
# It is scripts/recipes/s2l-cpu-en-de.sh with these settings; every variable of that recipe (SEEDS,
# SYSTEMS, MAX_UPDATE, JOBS, ...) overrides them.  A re-run resumes: finished runs are reused.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DATA=${DATA:-$REPO/../shared/data/mt/en-de}
export CORPUS_DIRS=${CORPUS_DIRS:-"$DATA/multi30k $DATA/tatoeba"}
export UNIT=${UNIT:-subword} THRESHOLD=${THRESHOLD:-20} BINS=${BINS:-20,25,30,40+} SPM_VOCAB=${SPM_VOCAB:-6000}
export MAX_UPDATE=${MAX_UPDATE:-1200} MAX_TOKENS=${MAX_TOKENS:-2048} LR=${LR:-0.005} WARMUP=${WARMUP:-200}
export SEEDS=${SEEDS:-"1 2 3"}
# the catalogue's group s2l-cpu-captions (fairseq_pe/systems.py): the quickstart's and the extrapolation encodings
export SYSTEMS=${SYSTEMS:-$(PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python}" -m fairseq_pe.systems names s2l-cpu-captions)}
WORK=${1:-s2l-cpu-captions-work}
[ $# -gt 0 ] && shift
FACTOR=${ROPE_SCALING_FACTOR:-4}
VARIANTS=()
if [ "$FACTOR" != none ] && [[ " $SYSTEMS " == *" rope "* ]]; then
    VARIANTS=(--decode-variant "rope-pi=rope:{'pe_rope_scaling': 'linear', 'pe_rope_scaling_factor': $FACTOR}"
              --decode-variant "rope-ntk=rope:{'pe_rope_scaling': 'ntk', 'pe_rope_scaling_factor': $FACTOR}"
              --decode-variant "rope-yarn=rope:{'pe_rope_scaling': 'yarn', 'pe_rope_scaling_factor': $FACTOR, 'pe_rope_scaling_original_length': 37}"
              --decode-variant "rope-yarn-resonance=rope:{'pe_rope_scaling': 'yarn', 'pe_rope_scaling_factor': $FACTOR, 'pe_rope_scaling_original_length': 37, 'pe_rope_resonance': True}")
fi
if [ "${REROPE_WINDOW:-16}" != none ] && [[ " $SYSTEMS " == *" rope "* ]]; then
    W=${REROPE_WINDOW:-16}
    VARIANTS+=(--decode-variant "rope-rerope=rope:{'pe_rerope_window': $W, 'pe_rerope_train_length': 37}"
               --decode-variant "rope-leaky-rerope=rope:{'pe_rerope_window': $W, 'pe_rerope_train_length': 37, 'pe_rerope_leaky_factor': 16}")
fi
for random in ape-sinusoidal-random rope-random; do
    if [[ " $SYSTEMS " == *" $random "* ]]; then
        VARIANTS+=(--decode-variant "$random-spaced=$random:{'pe_random_eval_decoder': 'spaced'}")
    fi
done
exec bash "$REPO/scripts/recipes/s2l-cpu-en-de.sh" "$WORK" "${VARIANTS[@]}" "$@"
