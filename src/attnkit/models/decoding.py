"""The models' step-by-step decoding, as every search drives it (``attnkit.decode.search.Decoding``):
``next_logits(tokens)`` for all tokens so far (only the new ones run, with the KV cache), ``reorder``
and ``keep`` of rows, ``repeat`` for beams, and ``merge`` of rows that began at other steps
(continuous batching, decode/continuous.py).

The models themselves (``models/seq2seq.py``, ``models/decoder_only.py``) read like their papers;
this is the bookkeeping around them: which rows share a source, where each row's first position is
in the cache, what is padded where when running batches merge. Each adapter names what it needs of
its model as a protocol (:class:`EncoderDecoderModel`, :class:`CausalModel`), so that this module
imports no model: the paper's encoder-decoder and the captioning Transformer both decode through
:class:`Seq2SeqDecoding`, GPT through :class:`CausalDecoding`.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from attnkit.attention.invariance import KEY_BUCKET, bucketed, each_query_alone
from attnkit.attention.multihead import KVCache
from attnkit.models.row_buffers import RowBuffers
from attnkit.nn.pointer import PointerGenerator
from attnkit.nn.transformer import DecoderCache


class _PadId(Protocol):
    pad_id: int


class EncoderDecoderModel(Protocol):
    """What :class:`Seq2SeqDecoding` needs of a model: the paper's ``EncoderDecoder``'s encode and
    decode (models/seq2seq.py), its generator, and its pointer-generator (None: no copying)."""

    config: _PadId
    pointer: PointerGenerator | None

    def source_mask(self, src: Tensor) -> Tensor | None: ...
    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor: ...
    def decode(
        self,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt: Tensor,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor: ...
    def new_cache(self) -> DecoderCache: ...
    def generator(self, hidden: Tensor) -> Tensor: ...


class CausalModel(Protocol):
    """What :class:`CausalDecoding` needs of a model: GPT's ``DecoderModel`` (models/decoder_only.py)."""

    def __call__(
        self, ids: Tensor, key_valid: Tensor | None, positions: Tensor | None, caches: list[KVCache] | None
    ) -> Tensor: ...
    def new_caches(self) -> list[KVCache]: ...


class Seq2SeqDecoding:
    """What search needs from an encoder-decoder (:class:`EncoderDecoderModel`): ``next_logits(tokens)``
    for all target tokens so far (``<s>`` first; with the KV cache only the new ones are run) and
    ``reorder(index)``.

    ``reorder`` keeps each row's memory: search only ever reorders rows among the beams of one source,
    whose memories are identical; ``keep`` moves the memories too. With the cache, the cross-attention
    keys and values stay one row per source however many beams it has (``beams`` consecutive rows):
    attention reads them once per source (``MultiHeadAttention._shared``).
    """

    def __init__(
        self, model: EncoderDecoderModel, src: Tensor, use_cache: bool, memory: Tensor | None = None
    ) -> None:
        """``memory``: the sources' encoding where it is computed already (by a compiled first step)."""
        self.model = model
        self.src_mask = model.source_mask(src)  # (N, 1, S)
        self.memory = model.encode(src, self.src_mask) if memory is None else memory  # (N, S, d_model)
        self.cache = model.new_cache() if use_cache else None
        self.beams = 1  # consecutive rows per source
        self.src = src  # (N, S): the pointer-generator copies these ids
        self.pointer_keys = None if model.pointer is None else model.pointer.keys(self.memory)
        self.src_valid = self.src_mask  # (N, 1, S): one row per source, as memory, src and pointer_keys
        # (R,): where each row's first token is in the cache, once rows that started at other steps
        # have joined (merge); None while every row starts at position 0
        self.first: Tensor | None = None
        self.buffers = RowBuffers()  # room behind the per-source tensors for sources that join

    def next_logits(self, tokens: Tensor) -> Tensor:
        """``tokens (N, t)`` -> logits of the next token ``(N, V)`` (log-probabilities with
        ``model.copy``). After a :meth:`merge`, each row's tokens are right-aligned (padding first)."""
        hidden = self._decoded(tokens)[:, -1]  # (R, d_model)
        return self._copied(self.model.generator(hidden), hidden)  # (R, V)

    # whether a check of a draft (checked_logits) gives each position the bits of this decoding's own
    # steps: the model's always (a compiled decoding's only with its compiled check step)
    checks_exactly = True

    def checked_logits(self, tokens: Tensor, count: int) -> Tensor:
        """The logits after each of the last ``count`` tokens of ``tokens (N, t)``, ``(N, count, V)``, the
        cache holding all the others: speculative decoding's check of a draft (decode/speculative.py).
        Each position's are the bits :meth:`next_logits` gives it a step at a time: the linear maps
        take every position at once (their rows sum alike in any number), attention and the copy
        mechanism each position as that step would (``attention.invariance.each_query_alone``). Every
        position stays in the cache: :meth:`rewind` drops those of the draft not taken."""
        if self.cache is None or tokens.size(1) - len(self.cache) != count:
            raise ValueError(f"checking {count} positions needs a cache of all the tokens but those")
        with each_query_alone():
            hidden = self._decoded(tokens)  # (R, count, d_model)
        logits = self.model.generator(hidden)  # (R, count, V)
        if self.model.pointer is None:
            return logits
        return torch.stack(
            [self._copied(logits[:, j].contiguous(), hidden[:, j].contiguous()) for j in range(count)], 1
        )

    def rewind(self, kept: Tensor, checked: int) -> None:
        """Of the last ``checked`` cached positions (a :meth:`checked_logits` call's), keep the first
        ``kept[r]`` of row r ``(R,)`` and forget the others (a draft's tokens the model did not take,
        decode/speculative.py); rows that keep fewer are padded on the left, their first positions
        noted (:attr:`first`), as a merge pads a shorter cache, so each row goes on at its own
        position."""
        assert self.cache is not None
        realign = Realignment(len(self.cache) - checked + kept)  # where each row's positions end
        for layer in self.cache.layers:
            key, value = layer.self_attn.key, layer.self_attn.value  # (R, h, T, d_k)
            layer.self_attn = KVCache(realign(key, 2, 0.0), realign(value, 2, 0.0))
        shift = kept.max() - kept  # (R,): the padding added before each row
        if bool(shift.any()):
            self.first = self._firsts() + shift

    def _decoded(self, tokens: Tensor) -> Tensor:
        """The decoder's states ``(R, new, d_model)`` of the tokens not yet cached (all without a cache)."""
        new = tokens[:, len(self.cache) :] if self.cache is not None else tokens
        positions = tgt_mask = None
        if self.first is not None:  # rows at different positions: each its own, its padding hidden
            columns = torch.arange(tokens.size(1), device=tokens.device)  # (t,)
            positions = (columns[None, -new.size(1) :] - self.first[:, None]).clamp(min=0)  # (R, new)
            tgt_mask = (columns[None, None, :] >= self.first[:, None, None]) & (
                columns[None, -new.size(1) :, None] >= columns[None, None, :]
            )  # (R, new, t): its own tokens, none after the query
        return self.model.decode(
            self.memory, self.src_mask, new, tgt_mask, cache=self.cache, positions=positions
        )

    def _copied(self, logits: Tensor, hidden: Tensor) -> Tensor:
        """The next token's scores from ``logits (R, V)`` and ``hidden (R, d_model)``: the logits, or
        with the copy mechanism its log-probabilities."""
        if self.model.pointer is None:
            return logits
        M = self.memory.size(0)  # the rows of one source are consecutive: (R, ·) -> (M, R / M, ·)
        log_probs = self.model.pointer(
            logits.view(M, -1, logits.size(-1)), hidden.view(M, -1, hidden.size(-1)),
            self.pointer_keys, self.memory, self.src, self.src_valid,
        )  # fmt: skip
        return log_probs.view_as(logits)

    def _select_sources(self, rows: Tensor) -> None:
        """Keep (or repeat) the memories of sources ``rows``, with what the pointer reads of them."""
        kept = self.buffers.kept
        self.memory = kept("memory", self.memory, rows)
        self.src, self.src_valid = kept("src", self.src, rows), kept("src_valid", self.src_valid, rows)
        if self.pointer_keys is not None:
            self.pointer_keys = kept("pointer_keys", self.pointer_keys, rows)

    def reorder(self, index: Tensor) -> None:
        if self.cache is not None:  # beams of one source share its memory: only the target side moves
            self.cache.reorder(index, sources_too=False)
        if self.first is not None:
            self.first = self.first.index_select(0, index)

    def keep(self, index: Tensor) -> int:
        """Keep rows ``index`` of any sources (search drops the finished ones, all beams of a source
        together): memories move too. Returns how many leading positions were forgotten (after a
        :meth:`merge`: the padding of rows that have left)."""
        self.src_mask = self.buffers.kept("src_mask", self.src_mask, index)
        if self.cache is None:
            self._select_sources(index)
            self._narrow_sources()
            return 0
        sources = index[:: self.beams] // self.beams  # the first beam of each kept source: its source
        self._select_sources(sources)
        kept = self.buffers.kept
        for i, layer in enumerate(self.cache.layers):
            layer.self_attn.reorder(index)
            key, value = layer.src_attn.key, layer.src_attn.value  # (N, h, S, d_k) each
            if key is not None:
                layer.src_attn = KVCache(kept(f"key {i}", key, sources), kept(f"value {i}", value, sources))
        self._narrow_sources()
        if self.first is None:
            return 0
        self.first = self.first.index_select(0, index)
        return self._forget_unused()

    def _narrow_sources(self) -> None:
        """Cut the sources' padding that no source kept needs: once the widest sources have left, the
        memories, masks, ids and cross-attention keys narrow to the widest left, rounded up to a
        multiple of ``KEY_BUCKET`` (each row's attention then reads them as it reads its source alone:
        docs/invariance.md). A merge pads the sources to the widest of both (:meth:`merge`), so without
        this a running batch (decode/continuous.py) kept the width of the widest that had joined since
        it was last empty, and a step's attention scores every position of that width, masked or not:
        at 32 clients of Multi30k, sources 36 positions wide where the widest running was 26, each row
        of a step cost 0.5 µs a padded position."""
        if self.src_valid is None or self.src_valid.size(-1) <= KEY_BUCKET or not self.src_valid.size(0):
            return
        width = self.src_valid.size(-1)
        narrow = int(bucketed(self.src_valid.sum(-1).amax().view(1)))  # the widest left, bucketed
        if narrow >= width:
            return
        self.memory = self.memory[:, :narrow].contiguous()  # (N, S', d_model)
        self.src = self.src[:, :narrow].contiguous()  # (N, S')
        self.src_valid = self.src_valid[..., :narrow].contiguous()  # (N, 1, S')
        self.src_mask = self.src_mask[..., :narrow].contiguous()  # (R, 1, S')
        if self.pointer_keys is not None:
            self.pointer_keys = self.pointer_keys[:, :narrow].contiguous()
        for layer in self.cache.layers if self.cache is not None else []:
            key, value = layer.src_attn.key, layer.src_attn.value  # (N, h, S, d_k) each
            if key is not None:
                layer.src_attn = KVCache(key[:, :, :narrow].contiguous(), value[:, :, :narrow].contiguous())

    def merge(self, other: Seq2SeqDecoding) -> None:
        """Add ``other``'s rows after these: sources that began later (continuous batching,
        decode/continuous.py), with as many rows per source and a KV cache each. The shorter cache is
        padded on the left, its rows' first positions noted (:attr:`first`), so that each row goes on
        at its own position with its own tokens; the sources are padded to the longer one's length."""
        if self.cache is None or other.cache is None or self.beams != other.beams:
            raise ValueError("only cached decodings with as many rows per source merge")
        T, T_other = len(self.cache), len(other.cache)
        first = torch.cat([self._firsts() + max(T_other - T, 0), other._firsts() + max(T - T_other, 0)])
        self._merge_sources(other)
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            # self-attention (R, h, T, d_k): padded on the left
            key = stacked(mine.self_attn.key, theirs.self_attn.key, 2, 0.0, left=True)
            mine.self_attn = KVCache(
                key, stacked(mine.self_attn.value, theirs.self_attn.value, 2, 0.0, left=True)
            )
        self.first = first

    def _merge_sources(self, other: Seq2SeqDecoding) -> None:
        """Add ``other``'s sources after these (:meth:`merge`): memories, masks, ids and the
        cross-attention's keys and values, padded on the right to the longer source; written behind
        these in their buffers (:class:`RowBuffers`: the running sources are not copied)."""
        pad_id, joined = self.model.config.pad_id, self.buffers.joined
        self.memory = joined("memory", self.memory, other.memory, 1, 0.0)  # (N, S, d_model)
        self.src = joined("src", self.src, other.src, 1, pad_id)  # (N, S)
        self.src_valid = joined("src_valid", self.src_valid, other.src_valid, 2, False)  # (N, 1, S)
        self.src_mask = joined("src_mask", self.src_mask, other.src_mask, 2, False)  # (R, 1, S)
        if self.pointer_keys is not None:
            self.pointer_keys = joined("pointer_keys", self.pointer_keys, other.pointer_keys, 1, 0.0)
        assert self.cache is not None and other.cache is not None
        for i, (mine, theirs) in enumerate(zip(self.cache.layers, other.cache.layers, strict=True)):
            key = joined(f"key {i}", mine.src_attn.key, theirs.src_attn.key, 2, 0.0)  # (N, h, S, d_k)
            value = joined(f"value {i}", mine.src_attn.value, theirs.src_attn.value, 2, 0.0)
            mine.src_attn = KVCache(key, value)

    def _firsts(self) -> Tensor:
        """Each row's first position in the cache (:attr:`first`, zeros before any merge)."""
        if self.first is not None:
            return self.first
        return torch.zeros(self.src_mask.size(0), dtype=torch.long, device=self.src_mask.device)

    def _forget_unused(self) -> int:
        """Drop the cached positions no row reads any more (those before every row's first): the
        padding of rows that have left; returns how many. Once no row has any, the steps mask nothing
        again."""
        assert self.first is not None
        unused = int(self.first.min()) if len(self.first) else 0
        if unused:
            self._drop_positions(unused)
        self.first = self.first - unused
        if not bool(self.first.any()):  # every row starts at position 0
            self.first = None
        return unused

    def _drop_positions(self, count: int) -> None:
        """Drop the first ``count`` positions of every row's self-attention cache."""
        assert self.cache is not None
        for layer in self.cache.layers:
            kept = layer.self_attn.key[:, :, count:], layer.self_attn.value[:, :, count:]
            layer.self_attn = KVCache(*kept)

    def repeat(self, times: int) -> None:
        """Each row becomes ``times`` consecutive rows (beam search's beams; at most once, before or
        after any step). With the cache the sources' memories, and their cross-attention keys and values
        (computed at the first step), stay one row per source; the target side's cache is repeated."""
        if self.beams != 1:
            raise ValueError(f"the rows are already repeated ({self.beams} per source)")
        rows = torch.arange(self.src_mask.size(0), device=self.src_mask.device).repeat_interleave(times)
        self.src_mask = self.src_mask.index_select(0, rows)  # (N·times, 1, S)
        self.beams = times
        if self.first is not None:
            self.first = self.first.index_select(0, rows)
        if self.cache is None:
            self._select_sources(rows)  # memory (N·times, S, d_model)
            return
        self.cache.reorder(rows, sources_too=False)


def stacked(first: Tensor, second: Tensor, dim: int, fill: float, left: bool = False) -> Tensor:
    """The rows of ``first`` then those of ``second``, the shorter padded with ``fill`` along ``dim``
    to the longer's size (after its entries, or ``left``: before them): what merging running batches
    does to sources (padded after), KV caches and tokens (padded before, so that the newest align)."""
    size = max(first.size(dim), second.size(dim))

    def padded(x: Tensor) -> Tensor:
        if x.size(dim) == size:
            return x
        shape = list(x.shape)
        shape[dim] = size - x.size(dim)
        padding = x.new_full(shape, fill)
        return torch.cat([padding, x] if left else [x, padding], dim=dim)

    return torch.cat([padded(first), padded(second)])


def realigned(x: Tensor, ends: Tensor, dim: int, fill: float) -> Tensor:
    """Each row of ``x`` (rows along dim 0) up to ``ends[r]`` along ``dim`` (exclusive), right-aligned
    at the width ``max(ends)``: rows that keep fewer are shifted right, ``fill`` before them (a
    speculative step's rows after each kept a draft's tokens of its own: decode/speculative.py)."""
    return Realignment(ends)(x, dim, fill)


class Realignment:
    """:func:`realigned` for several tensors of the same rows (every layer's keys and values): where
    each position comes from is worked out once."""

    def __init__(self, ends: Tensor) -> None:
        self.width = int(ends.max())
        shift = self.width - ends  # (R,)
        self.moves = bool(shift.any())
        # (R, width): where each position comes from (negative: before the row's first, filled)
        self.source = torch.arange(self.width, device=ends.device)[None, :] - shift[:, None]

    def __call__(self, x: Tensor, dim: int, fill: float) -> Tensor:
        if not self.moves:
            return x.narrow(dim, 0, self.width)
        shape = [1] * x.dim()
        shape[0], shape[dim] = x.size(0), self.width
        sizes = list(x.shape)
        sizes[dim] = self.width
        moved = x.gather(dim, self.source.clamp(min=0).view(shape).expand(sizes))
        return moved.masked_fill_((self.source < 0).view(shape), fill)


class CausalDecoding:
    """What search needs from a decoder-only model (:class:`CausalModel`): ``next_logits(tokens)`` for
    all tokens so far (prompt + generated; with the cache only the new ones are run) and
    ``reorder(index)`` of the rows."""

    def __init__(self, model: CausalModel, prompt_valid: Tensor, use_cache: bool) -> None:
        self.model, self.prompt_valid = model, prompt_valid
        self.caches = model.new_caches() if use_cache else None
        self.merged = False  # whether rows that began at other steps have joined (merge)

    def next_logits(self, tokens: Tensor) -> Tensor:
        """``tokens (N, t)``, the left-padded prompt followed by what was generated -> ``(N, V)``."""
        return self._uncached_logits(tokens)[:, -1]

    def checked_logits(self, tokens: Tensor, count: int) -> Tensor:
        """The logits after each of the last ``count`` tokens of ``tokens (N, t)``, ``(N, count, V)``, the
        cache holding all the others (a draft's check: decode/speculative.py), each position's the bits
        :meth:`next_logits` gives it a step at a time (attention takes each query as that step would:
        ``Seq2SeqDecoding.checked_logits``). Every position stays in the cache (:meth:`rewind`)."""
        seen = len(self.caches[0]) if self.caches else 0
        # (an empty cache: a prompt of one token, checked with its drafts: it is stepped as one query)
        if not self.caches or tokens.size(1) - seen != count:
            raise ValueError(f"checking {count} positions needs a cache of all the tokens but those")
        with each_query_alone():
            return self._uncached_logits(tokens)  # (N, count, V)

    def _uncached_logits(self, tokens: Tensor) -> Tensor:
        """The logits after each of the tokens of ``tokens (N, t)`` not yet cached (all without a cache),
        ``(N, new, V)``."""
        valid = self._valid(tokens.size(1))  # (N, t)
        positions = (valid.cumsum(-1) - 1).clamp(min=0)  # padding takes no position
        seen = len(self.caches[0]) if self.caches else 0
        return self.model(tokens[:, seen:], valid, positions[:, seen:], self.caches)

    def rewind(self, kept: Tensor, checked: int) -> None:
        """Of the last ``checked`` cached positions, keep the first ``kept[r]`` of row r ``(R,)`` (as
        ``Seq2SeqDecoding.rewind``): rows that keep fewer are padded on the left, padding that takes
        no position and is masked, as a shorter prompt's is."""
        assert self.caches
        cached = len(self.caches[0])
        realign = Realignment(cached - checked + kept)  # where each row's positions end
        self.prompt_valid = realign(self._valid(cached), 1, False)  # (N, cached'): its real tokens
        for i, cache in enumerate(self.caches):
            self.caches[i] = KVCache(realign(cache.key, 2, 0.0), realign(cache.value, 2, 0.0))
        self.merged = self.merged or realign.moves  # (keep then drops the padding no row needs)

    def reorder(self, index: Tensor) -> None:
        self.prompt_valid = self.prompt_valid.index_select(0, index)
        for cache in self.caches or []:
            cache.reorder(index)

    def keep(self, index: Tensor) -> int:
        """:meth:`reorder` (no source: keeping any rows is the same); after a :meth:`merge`, the
        leading positions that are padding in every row kept are forgotten: returns how many."""
        self.reorder(index)
        if not self.merged or not self.caches:
            return 0
        unused = int(self.prompt_valid.long().cumsum(-1).eq(0).sum(-1).min())  # leading padding, shared
        if unused:
            self.prompt_valid = self.prompt_valid[:, unused:]
            for i, cache in enumerate(self.caches):
                self.caches[i] = KVCache(cache.key[:, :, unused:], cache.value[:, :, unused:])
        return unused

    def merge(self, other: CausalDecoding) -> None:
        """Add ``other``'s rows after these: prompts that came later (continuous batching,
        decode/continuous.py), each with its cache. The shorter rows are padded on the left (their
        padding takes no position and is masked, as a short prompt's is), so each goes on as alone."""
        if not self.caches or not other.caches:
            raise ValueError("only cached decodings merge")
        T, T_other = len(self.caches[0]), len(other.caches[0])
        # the columns of the tokens (the cached ones and the newest) and the caches, padded on the left
        self.prompt_valid = stacked(self._valid(T + 1), other._valid(T_other + 1), 1, False, left=True)
        for i, (mine, theirs) in enumerate(zip(self.caches, other.caches, strict=True)):
            key = stacked(mine.key, theirs.key, 2, 0.0, left=True)
            self.caches[i] = KVCache(key, stacked(mine.value, theirs.value, 2, 0.0, left=True))
        self.merged = True

    def _valid(self, columns: int) -> Tensor:
        """Which of the first ``columns`` tokens of each row are real: its prompt's, then all."""
        N, P = self.prompt_valid.shape
        generated = torch.ones(N, columns - P, dtype=torch.bool, device=self.prompt_valid.device)
        return torch.cat([self.prompt_valid, generated], dim=1)  # (N, columns)
