"""Translation tasks generated in code, for a first run with nothing to download.

- ``dates``: human-written dates in several formats -> ISO 8601
  (``"3rd of May 1987"`` -> ``"1987-05-03"``).
  Reordering, lookup (month names) and copying, learnt in a couple of minutes on a CPU.
- ``copy``: a random digit string -> itself, the Annotated Transformer's first task.

And one monolingual text: :func:`slot_sentences`, "the cat sat on the mat" with each slot drawn at
random, for a language model or a masked-LM to learn in seconds (the tour's sampling and BERT pages).

Held-out sets are generated with another seed and never share a source sentence with training.
"""

from __future__ import annotations

import datetime as dt
import random

from attnkit.data.readers import ParallelText
from attnkit.errors import DataError

MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


FORMATS = (
    lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    lambda d: f"{MONTHS[d.month - 1][:3]} {d.day} {d.year}",
    lambda d: f"{_ordinal(d.day)} of {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{DAYS[d.weekday()]}, {d.day} {MONTHS[d.month - 1].lower()} {d.year}",
    lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",
    lambda d: f"{d.year}/{d.month}/{d.day}",
)


def random_date(rng: random.Random) -> dt.date:
    start = dt.date(1900, 1, 1).toordinal()
    return dt.date.fromordinal(rng.randrange(start, dt.date(2099, 12, 31).toordinal() + 1))


def dates(n: int, seed: int, exclude: set[str] | None = None) -> ParallelText:
    """``n`` (human date, ISO date) pairs, none of whose sources is in ``exclude``."""
    rng, exclude, seen = random.Random(seed), exclude or set(), set()
    src, tgt = [], []
    while len(src) < n:
        date = random_date(rng)
        text = rng.choice(FORMATS)(date)
        if text in exclude or text in seen:
            continue
        seen.add(text)
        src.append(text)
        tgt.append(date.isoformat())
    return ParallelText(src, tgt)


def copy(n: int, seed: int, exclude: set[str] | None = None, max_length: int = 10) -> ParallelText:
    """``n`` random digit strings of 1..max_length digits, each paired with itself."""
    rng, exclude = random.Random(seed), exclude or set()
    src: list[str] = []
    while len(src) < n:
        text = " ".join(rng.choice("123456789") for _ in range(rng.randint(1, max_length)))
        if text not in exclude:
            src.append(text)
    return ParallelText(src, list(src))


TASKS = {"dates": dates, "copy": copy}


def generate(task: str, n: int, seed: int, exclude: set[str] | None = None) -> ParallelText:
    if task not in TASKS:
        raise DataError(f"unknown synthetic task {task!r}; choose one of {sorted(TASKS)}")
    return TASKS[task](n, seed, exclude)


ANIMALS, VERBS, PLACES = (
    ("cat", "dog", "hen", "fox", "owl"),
    ("sat", "slept", "ran", "hid"),
    ("mat", "log", "den", "box"),
)


def slot_sentences(n: int, seed: int) -> list[str]:
    """``n`` sentences "the ANIMAL VERB on the PLACE" (no final stop), each slot drawn at random from
    :data:`ANIMALS`, :data:`VERBS` and :data:`PLACES`: three kinds of word, each in its own place."""
    rng = random.Random(seed)
    return [f"the {rng.choice(ANIMALS)} {rng.choice(VERBS)} on the {rng.choice(PLACES)}" for _ in range(n)]
