"""Extractive question answering generated in code (no QA set is available offline): short passages
about a few people, and a question whose answer is a span of the passage.

Each passage introduces two to four people, each with a birth date, a birthplace and a job, in sentences
of varied shape, and mixes in distractors (another date and city per person: when they moved, where
they work). A question asks for one fact of one person, so the answer is found only by reading the
question, finding that person, and picking the right one of several dates or cities:

    passage:  "Ines Baker, a painter, was born in Lyon on 3 May 1961. In 1990 Ines Baker moved to Oslo.
               Tom Weber was born on 12 June 1975 in Porto and works as a nurse in Kyiv."
    question: "When was Tom Weber born?"  ->  "12 June 1975"

Held-out sets are generated with another seed and share no passage with training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from attnkit.data.synthetic import FORMATS, random_date

FIRST = ["Ines", "Tom", "Maria", "Omar", "Lena", "Hugo", "Aiko", "Ravi", "Nora", "Felix", "Sara",
         "Jonas", "Mei", "Pablo", "Olga", "Karim", "Ada", "Liam", "Zoe", "Ivan", "Lucia", "Noah", "Elif",
         "Arjun"]  # fmt: skip
LAST = ["Baker", "Weber", "Rossi", "Novak", "Silva", "Tanaka", "Khan", "Moreau", "Berg", "Costa", "Meyer",
        "Lopez", "Kowalski", "Dubois", "Jensen", "Sato", "Petrov", "Haddad", "Fischer", "Brown"]  # fmt: skip
CITIES = ["Lyon", "Oslo", "Porto", "Kyiv", "Quito", "Accra", "Perth", "Seoul", "Lima", "Bergen", "Turin",
          "Krakow", "Dublin", "Hanoi", "Nairobi", "Leeds", "Graz", "Bonn", "Cusco", "Osaka"]  # fmt: skip
JOBS = ["painter", "nurse", "pilot", "baker", "teacher", "chemist", "lawyer", "farmer", "poet", "engineer",
        "dentist", "sailor", "architect", "librarian", "surgeon", "journalist"]  # fmt: skip
DATE_FORMATS = FORMATS[:4]  # the ones written out in words, as a passage would


@dataclass(frozen=True)
class QAExample:
    """A question, the passage holding its answer, and where the answer is (character offsets)."""

    question: str
    context: str
    answer: str
    answer_start: int  # context[answer_start : answer_start + len(answer)] == answer


def _person_sentences(rng: random.Random, name: str, born: str, city: str, job: str) -> list[str]:
    """Two sentences about one person, with the facts in varied order and wording, and distractors."""
    moved, works_in = rng.choice(CITIES), rng.choice(CITIES)
    job = ("an " if job[0] in "aeiou" else "a ") + job
    year = str(rng.randint(1900, 2099))
    first = rng.choice(
        [
            f"{name} was born on {born} in {city}.",
            f"{name}, {job}, was born in {city} on {born}.",
            f"Born in {city} on {born}, {name} became {job}.",
            f"On {born}, {name} was born in {city}.",
        ]
    )
    second = rng.choice(
        [
            f"In {year} {name} moved to {moved}.",
            f"{name} works as {job} in {works_in}.",
            f"Later {name} lived in {moved} and worked as {job}.",
            f"{name} visited {moved} in {year}.",
        ]
    )
    return [first, second]


QUESTIONS = {
    "born": ["When was {name} born?", "What is the birth date of {name}?", "On what date was {name} born?"],
    "city": ["Where was {name} born?", "In which city was {name} born?", "What is {name}'s birthplace?"],
}


def people_questions(n: int, seed: int, exclude: set[str] | None = None) -> list[QAExample]:
    """``n`` question/passage/answer triples, none of whose passages is in ``exclude``."""
    rng, exclude, examples = random.Random(seed), exclude or set(), []
    while len(examples) < n:
        count = rng.randint(2, 4)
        names = rng.sample([f"{f} {last}" for f in FIRST for last in LAST], count)
        facts = [
            {"born": rng.choice(DATE_FORMATS)(random_date(rng)), "city": rng.choice(CITIES)} for _ in names
        ]
        sentences = [
            s
            for name, fact in zip(names, facts, strict=True)
            for s in _person_sentences(rng, name, fact["born"], fact["city"], rng.choice(JOBS))
        ]
        context = " ".join(sentences)
        if context in exclude:
            continue
        who = rng.randrange(count)
        kind = rng.choice(sorted(QUESTIONS))
        answer = facts[who][kind]
        # The answer is located in the person's first sentence, which states the fact; a distractor with
        # the same text (another person born in the same city) is elsewhere and is not the answer span.
        own = sentences[2 * who]
        start = context.index(own) + own.index(answer)
        question = rng.choice(QUESTIONS[kind]).format(name=names[who])
        examples.append(QAExample(question, context, answer, start))
    return examples
