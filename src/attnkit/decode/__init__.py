"""Decoding: greedy search (search.py) and beam search (beams.py), separate from the model as in JoeyNMT."""

from attnkit.decode.beams import beam_search
from attnkit.decode.search import Hypothesis, Search, greedy, length_penalty

__all__ = ["Hypothesis", "Search", "beam_search", "greedy", "length_penalty"]
