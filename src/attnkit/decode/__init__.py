"""Decoding: greedy and beam search (search.py), separate from the model as in JoeyNMT."""

from attnkit.decode.search import Hypothesis, Search, beam_search, greedy, length_penalty

__all__ = ["Hypothesis", "Search", "beam_search", "greedy", "length_penalty"]
