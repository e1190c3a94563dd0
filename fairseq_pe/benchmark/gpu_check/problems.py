"""What a failing check raises: the problems it found, each naming what failed and the measure."""

from typing import List, Optional


class CheckFailed(Exception):
    """Raised by a check with the problems it found (each names what failed and the measure)."""

    def __init__(self, problems: List[str], details: Optional[dict] = None):
        super().__init__("; ".join(problems))
        self.problems = problems
        self.details = details or {}


def dedupe(problems):
    seen = []
    for p in problems:
        if p not in seen:
            seen.append(p)
    return seen
