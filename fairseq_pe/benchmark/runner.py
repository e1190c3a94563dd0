"""What the measurements of ``fairseq-pe-benchmark`` share: the child processes and what they print, the time a run
has taken and has left, the time and memory of a call measured inside a child, and the results files.

Each measurement runs in a fresh process, one at a time (:func:`run`); a child prints its figures as ``KEY VALUE``
lines, read by :func:`found`, and whether it imported the plugin (:func:`check_plugin`: stock fairseq never does).
:data:`MEASURE` is the code with which a child times a call and measures its peak extra memory.  Progress (one line
per measurement with an estimate of the time left, :class:`Progress`) goes to stderr; :func:`write_results` writes a
measurement's Markdown, JSON and PNG, each atomically, and prints its tables.
"""

import os
import re
import subprocess
import sys
import time

from fairseq_pe.benchmark.models import STOCK
from fairseq_pe.outputs import write_json, write_text

#: the plugin's folder (fairseq's ``--user-dir``) and the folder that holds it (a child puts it on its ``sys.path``)
PLUGIN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(PLUGIN)


def log(msg):
    print(f"[benchmark {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def duration(seconds):
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class MeasurementFailed(Exception):
    pass


def run(cmd, env, what):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise MeasurementFailed(f"{what} failed (exit status {proc.returncode}"
                                f"{', killed: out of memory?' if proc.returncode == -9 else ''}):\n{out[-4000:]}")
    return out


def found(pattern, out, what, cast=float):
    m = re.search(pattern, out)
    if m is None:
        raise SystemExit(f"fairseq-pe-benchmark: {what}: no {pattern!r} in its output:\n{out[-3000:]}")
    return cast(m.group(1))


def check_plugin(name, out, what):
    loaded = found(r"PLUGIN_LOADED (\d)", out, what, int)
    if loaded != (name != STOCK):
        raise SystemExit(f"fairseq-pe-benchmark: {what}: fairseq_pe was {'' if loaded else 'not '}imported")


def machine_load():
    """The 1-minute load average (None where the system does not tell)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


class Progress:
    """Counts the measurements and estimates the time left from the ones done."""

    def __init__(self, plan):
        self.plan = plan  # [(system, kind)], in order
        self.done = 0
        self.seconds = {}
        self.start = time.time()

    def estimate(self, name, kind):
        if (name, kind) in self.seconds:
            return self.seconds[(name, kind)]
        length = re.search(r"T=(\d+)", kind)
        if length and not any(k == kind for _, k in self.seconds):
            # not yet measured at this length: the longest measured of the same kind, scaled as attention's
            # time grows, with the square of T
            shape = re.sub(r"T=\d+", "T=", kind)
            done = [(int(re.search(r"T=(\d+)", k).group(1)), s) for (_, k), s in self.seconds.items()
                    if "T=" in k and re.sub(r"T=\d+", "T=", k) == shape]
            if done:
                longest = max(t for t, _ in done)
                values = [s for t, s in done if t == longest]
                return sum(values) / len(values) * (int(length.group(1)) / longest) ** 2
        for similar in (lambda k: k == kind, lambda k: k.split()[0] == kind.split()[0], lambda k: True):
            values = [s for (_, k), s in self.seconds.items() if similar(k)]
            if values:
                return sum(values) / len(values)
        return None

    def record(self, name, kind, seconds):
        self.seconds[(name, kind)] = seconds
        self.done += 1
        left = [self.estimate(n, k) for n, k in self.plan[self.done:]]
        known = sum(s for s in left if s is not None)
        return (f"{self.done}/{len(self.plan)} done in {duration(time.time() - self.start)}, "
                f"~{duration(known)} left" if left else f"{self.done}/{len(self.plan)} done in "
                f"{duration(time.time() - self.start)}")


# the child scripts' measurement: sync(), and measure(call, repeats): a first call (timed alone: a compile shows
# there), then REPEATS timed calls, each with its peak extra memory (the GPU's allocated memory beyond what is
# allocated before the call, or the resident memory's peak beyond the resident size before it); (first, times, peak).
# A child that runs several measurements in one process sets trim_heap: glibc's free heap is handed back to the system
# (malloc_trim) before each call, or a call could reuse the resident pages that an earlier one freed and show no peak
MEASURE = r"""
import ctypes
def sync():
    if device == "cuda":
        torch.cuda.synchronize()
def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
def timed(call):
    sync()
    start = time.perf_counter()
    call()
    sync()
    return time.perf_counter() - start
def measure(call, repeats):
    first = timed(call)
    times, peaks = [], []
    for _ in range(repeats):
        gc.collect()
        if trim_heap:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        if device == "cuda":  # the GPU's peak allocated memory beyond what is allocated now (model, gradients, input)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            times.append(timed(call))
            peaks.append((torch.cuda.max_memory_allocated() - base) // 1024)
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak (VmHWM) to the current resident size
            base = rss_kb("VmRSS:")
            times.append(timed(call))
            peaks.append(rss_kb("VmHWM:") - base)
    return first, times, max(peaks)
"""


def write_results(outputs, text, payload, draw, printed, progress) -> int:
    """Write the Markdown ``text``, the JSON ``payload`` and the PNG (``draw(path)``) to ``outputs`` (.md, .json,
    .png), print the tables; 0."""
    write_json(outputs[1], payload, indent=2)
    draw(outputs[2])
    write_text(outputs[0], text)
    print(printed, flush=True)
    log(f"wrote {', '.join(outputs)} in {duration(time.time() - progress.start)}")
    return 0
