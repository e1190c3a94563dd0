"""A synthetic translation task that needs word order and tests length extrapolation.

The source language has determiners, adjectives, nouns and verbs; the target language
maps every word to its own translation (a bijective vocabulary mapping) and reorders
locally: an adjective that precedes a noun is moved after it (as in English -> French,
"red car" -> "voiture rouge"), and a run of adjectives is reversed behind the noun.
A model must therefore know where each source word sits relative to its neighbours, and
where it is in the output, so that an encoder without positional information cannot solve
it.  Training sentences are short; test sentences are longer, which is what exposes how an
encoding extrapolates beyond the lengths seen in training.
"""

import os
import random
from typing import List, Sequence, Tuple

NUM_DETERMINERS = 4
NUM_ADJECTIVES = 24
NUM_NOUNS = 48
NUM_VERBS = 16


def _word(kind: str, idx: int, target: bool) -> str:
    return f"{kind.upper() if target else kind}{idx}"


def make_phrase(rng: random.Random, max_adjectives: int = 2) -> List[Tuple[str, int]]:
    """One noun phrase: optional determiner, 0..max_adjectives adjectives, a noun."""
    phrase = []
    if rng.random() < 0.5:
        phrase.append(("d", rng.randrange(NUM_DETERMINERS)))
    for _ in range(rng.randint(0, max_adjectives)):
        phrase.append(("a", rng.randrange(NUM_ADJECTIVES)))
    phrase.append(("n", rng.randrange(NUM_NOUNS)))
    return phrase


def make_sentence(rng: random.Random, min_len: int, max_len: int) -> List[Tuple[str, int]]:
    """Phrases separated by verbs until the length falls in [min_len, max_len]."""
    while True:
        target_len = rng.randint(min_len, max_len)
        words: List[Tuple[str, int]] = []
        while len(words) < target_len:
            if words:
                words.append(("v", rng.randrange(NUM_VERBS)))
            words.extend(make_phrase(rng))
        if min_len <= len(words) <= max_len:
            return words


def translate(words: Sequence[Tuple[str, int]]) -> List[Tuple[str, int]]:
    """Target order: determiner, noun, then the phrase's adjectives in reverse order."""
    out: List[Tuple[str, int]] = []
    pending_adjectives: List[Tuple[str, int]] = []
    for kind, idx in words:
        if kind == "a":
            pending_adjectives.append((kind, idx))
        elif kind == "n":
            out.append((kind, idx))
            out.extend(reversed(pending_adjectives))
            pending_adjectives = []
        else:
            out.append((kind, idx))
    assert not pending_adjectives, "every phrase ends in a noun"
    return out


def render(words: Sequence[Tuple[str, int]], target: bool) -> str:
    return " ".join(_word(kind, idx, target) for kind, idx in words)


def make_pairs(rng: random.Random, count: int, min_len: int, max_len: int) -> List[Tuple[str, str]]:
    pairs = []
    for _ in range(count):
        words = make_sentence(rng, min_len, max_len)
        pairs.append((render(words, target=False), render(translate(words), target=True)))
    return pairs


def write_corpus(
    out_dir: str,
    train_size: int = 20000,
    valid_size: int = 500,
    train_lengths: Tuple[int, int] = (1, 16),
    test_buckets: Sequence[Tuple[int, int]] = ((1, 16), (17, 24), (25, 32), (33, 48)),
    test_per_bucket: int = 200,
    seed: int = 1,
    src: str = "src",
    tgt: str = "tgt",
) -> str:
    """Write train/valid/test.{src,tgt}; train and valid hold only short sentences."""
    rng = random.Random(seed)
    os.makedirs(out_dir, exist_ok=True)
    splits = {
        "train": make_pairs(rng, train_size, *train_lengths),
        "valid": make_pairs(rng, valid_size, *train_lengths),
        "test": [p for lo, hi in test_buckets for p in make_pairs(rng, test_per_bucket, lo, hi)],
    }
    for split, pairs in splits.items():
        for side, lang in ((0, src), (1, tgt)):
            with open(os.path.join(out_dir, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(p[side] + "\n" for p in pairs)
    return out_dir
