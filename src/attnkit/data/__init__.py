"""Data: readers (validated, clear errors), tokenisers, token-budget batching, synthetic tasks."""

from attnkit.data.batching import Batch, make_batch, token_batches
from attnkit.data.readers import ParallelText, read_lines, read_parallel
from attnkit.data.tokenizer import Tokenizer

__all__ = ["Batch", "ParallelText", "Tokenizer", "make_batch", "read_lines", "read_parallel", "token_batches"]
