"""What the speculative decoding tests share: drafts that know the answer but for spoilt tokens, and a
tiny model trained for a moment on a text."""

from __future__ import annotations

import random

import torch

from attnkit.data.tokenizer import Tokenizer
from attnkit.decode import continuous


class Foretold:
    """Drafts that know plain greedy search's output (``outputs``, each row's, ``</s>`` last where it
    ended) and spoil one token in ``spoiled`` at random: the model takes a random share of each draft,
    so rows keep different numbers of tokens at every step."""

    def __init__(self, outputs: list[list[int]], spoiled: int, seed: int) -> None:
        self.outputs, self.spoiled, self.rng = outputs, spoiled, random.Random(seed)

    def propose(self, rows, written, lengths, tokens) -> list[list[int]]:
        ahead = [self.outputs[r][len(written[r]) :] for r in rows]
        drafts = [tokens[:n] for tokens, n in zip(ahead, lengths, strict=True)]
        return [[another(t) if self.rng.randrange(self.spoiled) == 0 else t for t in d] for d in drafts]

    def drawn_from(self, index):
        return None  # proposed for certain

    def checked(self, kept) -> None:
        pass

    def keep(self, index) -> None:
        pass


def another(token: int) -> int:
    """A token of the vocabulary other than ``token`` (every test vocabulary has more than five)."""
    return token - 1 if token > 4 else token + 1


def trained_on(
    model: torch.nn.Module, tokenizer: Tokenizer, text: str, steps: int, lr: float
) -> torch.nn.Module:
    """``model`` (a decoder) after ``steps`` of Adam at ``lr`` on blocks of 33 tokens of ``text``, in eval
    mode: it continues text plausibly but not exactly."""
    stream = torch.tensor(tokenizer.encode(text))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - 33, (16,))
        block = torch.stack([stream[s : s + 33] for s in starts])  # (16, 33)
        loss = torch.nn.functional.cross_entropy(model(block[:, :-1]).transpose(1, 2), block[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def counted_checks(monkeypatch) -> list[tuple[int, int]]:
    """Each check of a draft in a running batch (decode/continuous.py) from now on, ``(drafted, taken)``."""
    checks: list[tuple[int, int]] = []
    checked = continuous.check

    def counted(checking, tokens, proposals, *args, **kwargs):
        step = checked(checking, tokens, proposals, *args, **kwargs)
        checks.append((len(proposals[0]), step.taken[0]))
        return step

    monkeypatch.setattr(continuous, "check", counted)
    return checks


def settled(running, arrivals: dict[int, list]) -> tuple[dict, dict]:
    """A running batch (decode/continuous.py) iterated until every input of ``arrivals`` (by the
    iteration it joins at) is done: each input's output by its key, and the iteration it ended at."""
    done, ended, i = {}, {}, 0
    while i <= max(arrivals) or running.sources:
        for key, found in running.iterate(arrivals.get(i, [])):
            done[key], ended[key] = found, i
        i += 1
        assert i < 500
    return done, ended
