"""The encoder forward's memory: the peak extra resident memory of one encoder forward of one sentence of T tokens
(``--lengths``) in train mode with autograd on (as in training), after a warm-up forward, with
``MALLOC_MMAP_THRESHOLD_=65536`` (large tensors are mapped and unmapped, so the resident size follows the live
tensors); on CUDA the GPU's peak allocated memory beyond what the model and its input hold.  Each length in a fresh
process.  For ``stock`` the child builds fairseq's ``TransformerModel`` from the stock architecture and flags, without
importing ``fairseq_pe``; the plugin systems build ``TransformerPEModel``; both with ``--max-source-positions T+8``.
``--encoder-batch left-padded`` measures a batch of that sentence and one of T/2 tokens padded on the left, as fairseq
batches a source.  A length that fails (a long sentence that does not fit in memory) is "failed" and the run goes on.
"""

import sys
import time

from fairseq_pe.benchmark.models import BUILD_MODEL
from fairseq_pe.benchmark.runner import MeasurementFailed, check_plugin, found, log, run

# one encoder forward of one T-token sentence, stock fairseq or the plugin, with the same settings;
# prints the peak extra resident memory (KiB)
ENCODER_CHILD = r"""
import argparse, sys
kind, repo, arch, length, threads, vocab, batch, device, dtype = sys.argv[1:10]
length, threads, vocab, flags = int(length), int(threads), int(vocab), sys.argv[10:]
""" + BUILD_MODEL + r"""
model.train()
tokens = torch.randint(d.nspecial, len(d), (1 if batch == "one" else 2, length))
lengths = torch.tensor([length] * tokens.size(0))
if batch == "left-padded":  # a second sentence of half the length, padded on the left as fairseq batches a source
    tokens[1, :length - length // 2] = d.pad()
    lengths[1] = length // 2
tokens, lengths = tokens.to(device), lengths.to(device)
def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
model.encoder(tokens, lengths)  # warm-up (lazy caches)
if device == "cuda":  # the GPU's peak allocated memory beyond what is allocated now (model, input)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = model.encoder(tokens, lengths)["encoder_out"][0]
    torch.cuda.synchronize()
    extra_kb = (torch.cuda.max_memory_allocated() - base) // 1024
else:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    base = rss_kb("VmRSS:")
    out = model.encoder(tokens, lengths)["encoder_out"][0]
    extra_kb = rss_kb("VmHWM:") - base
assert out.requires_grad and out.shape[0] == length
print("PEAK_EXTRA_KB", extra_kb, flush=True)
print("PARAMS", sum(p.numel() for p in model.parameters()), flush=True)
print("THREADS", torch.get_num_threads(), flush=True)
print("PLUGIN_LOADED", int("fairseq_pe" in sys.modules), flush=True)
"""


def encoder_memory(args, name, cmds, env, progress, round_):
    # a fixed mmap threshold: large tensors are always mapped and unmapped, so the resident size
    # follows the live tensors (glibc's adaptive threshold would recycle freed heap)
    child_env = dict(env, MALLOC_MMAP_THRESHOLD_=str(64 * 1024))
    enc, errors, params = {}, {}, None
    for length in args.lengths:
        cmd = list(cmds["encoder"])
        cmd[3] = str(length)
        what = f"{name}: encoder forward T={length}"
        start = time.time()
        try:
            out = run([sys.executable, "-c", ENCODER_CHILD, *cmd], child_env, what)
        except MeasurementFailed as e:
            # a long sentence may not fit in memory: the other measurements go on, the table says "failed"
            enc[str(length)], errors[str(length)] = None, str(e).splitlines()[0] + "\n..." + str(e)[-2000:]
            log(f"round {round_}, {name}: encoder forward T={length} FAILED ({str(e).splitlines()[0]}; "
                f"{progress.record(name, f'encoder T={length}', time.time() - start)})")
            continue
        check_plugin(name, out, what)
        if found(r"THREADS (\d+)", out, what, int) != args.threads:
            raise SystemExit(f"fairseq-pe-benchmark: {what}: torch did not use {args.threads} threads")
        enc[str(length)] = found(r"PEAK_EXTRA_KB (-?\d+)", out, what, int)
        params = found(r"PARAMS (\d+)", out, what, int)
        log(f"round {round_}, {name}: encoder forward T={length}: {enc[str(length)] / 1024:.1f} MiB "
            f"({progress.record(name, f'encoder T={length}', time.time() - start)})")
    return enc, errors, params
