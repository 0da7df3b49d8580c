"""Decoding: greedy and beam search (search.py), separate from the model as in JoeyNMT."""

from attnkit.decode.search import Hypothesis, beam_search, greedy, length_penalty

__all__ = ["Hypothesis", "beam_search", "greedy", "length_penalty"]
