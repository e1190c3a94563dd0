"""The time budget: seconds counted from the process's start (imports included) when the check runs as a command,
from the run's start when it is called in-process; the time left, and the alarm that stops a check at the end."""

import time

PROCESS_START = time.monotonic()  # the budget counts from here: the imports of torch and fairseq are in it


class OutOfTime(BaseException):
    """The alarm at the end of the budget (a BaseException: fairseq's and the checks' ``except Exception`` let it
    through)."""


_deadline = None


def set_deadline(deadline):
    """The end of the budget (``time.monotonic()``'s clock), or None: no end."""
    global _deadline
    _deadline = deadline


def remaining_seconds() -> float:
    return max(0.0, _deadline - time.monotonic()) if _deadline is not None else 1e9


def cpu_seconds() -> float:
    import resource

    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def alarm(signum, frame):
    raise OutOfTime()
