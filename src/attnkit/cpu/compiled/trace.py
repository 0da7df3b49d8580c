"""The decoding steps as ``torch.export`` traces them: :class:`FirstStep`, the model's own ``encode``
and first ``decode`` (the start token after each source), and :class:`CachedStep`, its ``decode`` of
one new token per row with its KV cache rebuilt from tensors (:class:`CheckStep`: of several, a
draft's check); and example inputs whose sizes are symbols.

The self-attention's past keys and values come in as one tensor, ``history (T, 2·layers, P, h, d_k)``
(position t of every row at ``[t]``: layer i's keys at ``[t, i]``, its values at ``[t, layers + i]``),
and ``slots (R, T)``, which slot of ``[t]`` holds row r's position t (:class:`SlotHistory`). Beam
search's reordering then moves slots (R·T small integers) instead of copying every row's keys at
every step, and the step reads each row's keys once, gathered by the slots inside the attention
(:func:`attnkit.cpu.attention.attend_as_sums`); it returns only the new position's keys and
values, ``(2·layers, R, h, d_k)`` in the history's dtype, which the caller writes into ``[T]``
(decode/compiled.py): one copy a step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from attnkit.attention.masks import padding_mask
from attnkit.attention.multihead import KVCache
from attnkit.cpu.attention import decoding_step
from attnkit.cpu.linear import linear_precision
from attnkit.cpu.search import RuledOut, best_by_blocks
from attnkit.ranking import best_continuations_by_top_k

if TYPE_CHECKING:
    from attnkit.models.seq2seq import EncoderDecoder


class SlotHistory(KVCache):
    """A self-attention cache of ``T`` positions held as buffers ``(T, P, h, d_k)`` and ``slots (R, T)``
    (see the module docstring); ``append`` returns every row's keys and values so far, ``(R, h, T + C,
    d_k)``, as an expression of the buffers that the compiler fuses into the attention reading them,
    and keeps the ``C`` new ones (``new_key``, ``new_value``: ``(R, h, C, d_k)``), rounded to the
    buffers' dtype as the steps after read them."""

    def __init__(self, keys: Tensor, values: Tensor, slots: Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.slots = keys, values, slots
        self.new_key: Tensor | None = None
        self.new_value: Tensor | None = None

    def positions(self) -> int:
        return self.keys.size(0)

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        # the new positions' keys and values as the history holds them (bf16 in a bf16 model), which is
        # how the steps after this one read them: so a check step's position reads the positions checked
        # before it in the same step as a step of one token would (CheckStep), and its own alike
        key, value = key.to(self.keys.dtype).to(key.dtype), value.to(self.values.dtype).to(value.dtype)
        self.new_key, self.new_value = key, value
        positions = torch.arange(self.keys.size(0), device=key.device)[None, :]  # (1, T)
        past_keys = self.keys[positions, self.slots].transpose(1, 2)  # (R, T, h, d_k) -> (R, h, T, d_k)
        past_values = self.values[positions, self.slots].transpose(1, 2)
        keys = torch.cat([past_keys.to(key.dtype), key], dim=2)  # (R, h, T + C, d_k)
        return keys, torch.cat([past_values.to(value.dtype), value], dim=2)


class FirstStep(nn.Module):
    """``model.encode`` of the sources and ``model.decode`` of the start token, as export traces them:
    ``(src (N, S), start (N, 1))`` -> ``(logits (N, V), memory (N, S, d_model), the layers'
    self-attention keys (N, h, 1, d_k)..., values..., cross-attention keys (N, h, S, d_k)...,
    values...)``: everything the steps after it take (:class:`CachedStep`). The encoder's attention is
    sums too (``attnkit.cpu.attention.decoding_step``), over keys padded to whole vectors of the
    compiler's sums: a source then gets the same bits at any width, so sources of every width share a
    first step."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, start: Tensor) -> tuple[Tensor, ...]:
        src_mask = padding_mask(src, self.model.config.pad_id)  # (N, 1, S)
        cache = self.model.new_cache()
        with decoding_step():
            memory = self.model.encode(src, src_mask)  # (N, S, d_model)
            hidden = self.model.decode(memory, src_mask, start, cache=cache)[:, -1]  # (N, d_model)
        layers = cache.layers
        kept = [layer.self_attn.key for layer in layers] + [layer.self_attn.value for layer in layers]
        kept += [layer.src_attn.key for layer in layers] + [layer.src_attn.value for layer in layers]
        return (self.model.generator(hidden), memory, *kept)


class CachedStep(nn.Module):
    """``model.decode`` of one new token per row with a cache made of tensors, as export traces it:
    ``(new (R, 1), slots (R, T), first (R,), src_mask (R, 1, S), history (T, 2·layers, P, h, d_k),
    cross-attention keys (N, h, S, d_k)..., values...)`` -> ``(logits (R, V), the new position's
    self-attention keys and values (2·layers, R, h, d_k))`` (see the module docstring). ``first``:
    where each row's own positions begin in the history (0, but for rows that joined a running batch
    later, decode/continuous.py: the positions before are padding, masked)."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, new: Tensor, slots: Tensor, first: Tensor, src_mask: Tensor, history: Tensor, *crossed: Tensor
    ) -> tuple[Tensor, Tensor]:
        hidden, added = self.decoded(new, slots, first, src_mask, history, crossed)
        return self.model.generator(hidden[:, -1]), added.squeeze(2)  # (R, V), (2n, R, h, d_k)

    def decoded(
        self, new: Tensor, slots: Tensor, first: Tensor, src_mask: Tensor, history: Tensor, crossed: tuple
    ) -> tuple[Tensor, Tensor]:
        """The decoder's states of the ``C`` new tokens ``new (R, C)``, ``(R, C, d_model)``, and their
        positions' self-attention keys and values, ``(2·layers, R, C, h, d_k)``: each new position
        attends to the row's own positions up to itself."""
        cache = self.model.new_cache()
        n = len(cache.layers)
        for i, layer in enumerate(cache.layers):
            layer.self_attn = SlotHistory(history[:, i], history[:, n + i], slots)
            layer.src_attn.hold(crossed[i], crossed[n + i])
        unused_memory = crossed[0]  # the cross-attention reads its cache, not the memory
        # each row's own positions: from ``first`` on (rows that joined later are padded before it)
        T, C = slots.size(1), new.size(1)
        columns = torch.arange(T + C, device=first.device)  # (T + C,)
        positions = (T - first)[:, None] + columns[None, :C]  # (R, C): the new tokens'
        own = columns[None, None, :] >= first[:, None, None]  # (R, 1, T + C)
        if C > 1:  # (the check step's C is a symbol of at least 2, the plain step's 1) none after its query
            own = own & (columns[None, :] <= T + columns[:C, None])[None]  # (R, C, T + C)
        with decoding_step():
            hidden = self.model.decode(unused_memory, src_mask, new, own, cache=cache, positions=positions)
        kept = [layer.self_attn.new_key for layer in cache.layers]
        kept += [layer.self_attn.new_value for layer in cache.layers]
        # (2n, R, h, C, d_k) -> (2n, R, C, h, d_k)
        added = torch.stack(kept).transpose(2, 3).to(history.dtype)
        return hidden, added


class CheckStep(CachedStep):
    """:class:`CachedStep` of ``C >= 2`` new tokens per row: ``new (R, C)`` -> ``(logits (R, C, V), the
    new positions' keys and values (2·layers, R, C, h, d_k))``, speculative decoding's check of a
    draft (decode/speculative.py), or a draft decoder's catching up on tokens it sat out. Each new
    position attends to the row's positions up to itself alone, as attention's sums
    (``attnkit.cpu.attention.attend_as_sums``) mask the others with exact zeros, and reads the new
    positions before it rounded as the history holds them (:class:`SlotHistory`), so each position's
    logits are the bits :class:`CachedStep` gives it a token at a time
    (tests/decode/test_speculative_compiled.py)."""

    def forward(  # type: ignore[override]
        self, new: Tensor, slots: Tensor, first: Tensor, src_mask: Tensor, history: Tensor, *crossed: Tensor
    ) -> tuple[Tensor, Tensor]:
        hidden, added = self.decoded(new, slots, first, src_mask, history, crossed)
        return self.model.generator(hidden), added  # (R, C, V)


class RankedStep(CachedStep):
    """:class:`CachedStep` that ranks instead of returning the logits, for beam search of ``beams`` rows
    per source: with three inputs more before the cross-attention's, ``scores (N, beams)`` (each beam's
    log-probability so far), ``at_limit (R,)`` (rows that may only end) and ``allowed (2, V)`` (the
    tokens ever generated, and ``</s>`` alone), it returns ``(best scores (N, 2·beams), their beams,
    their tokens, the new position's keys and values)``: each source's best 2·beams continuations, as
    the search ranks the logits otherwise (``attnkit.decode.search.best_continuations``), computed
    where the logits are made, with the log-softmax applied only to the entries the ranking reads
    (``attnkit.cpu.search.best_by_blocks``' ``normaliser``), and the tokens ruled out there too
    (``attnkit.cpu.search.RuledOut``: ``allowed[1]`` holds one token)."""

    def __init__(self, model: EncoderDecoder, beams: int) -> None:
        super().__init__(model)
        self.width = 2 * beams  # up to ``beams`` candidates may end in </s>

    def forward(  # type: ignore[override]
        self,
        new: Tensor,
        slots: Tensor,
        first: Tensor,
        src_mask: Tensor,
        history: Tensor,
        scores: Tensor,
        at_limit: Tensor,
        allowed: Tensor,
        *crossed: Tensor,
    ) -> tuple[Tensor, ...]:
        logits, added = super().forward(new, slots, first, src_mask, history, *crossed)
        logits = logits.float()  # (R, V)
        maximum = logits.amax(-1)  # (R,): log_softmax = (logits - maximum) - log_sum, as torch's
        log_sum = (logits - maximum[:, None]).exp().sum(-1).log()  # (R,)
        # the tokens ruled out as the search rules them out (decode/search.py next_log_probs), where the
        # ranking reads the logits
        ruled_out = RuledOut(ever=allowed[0], end=allowed[1], at_limit=at_limit)
        found = best_by_blocks(logits, scores, self.width, (maximum, log_sum), ruled_out)
        if found is None:  # a vocabulary of few blocks: every log-probability, ranked as the search does
            logits = ruled_out.everywhere(logits)
            log_probs = (logits - maximum[:, None]) - log_sum[:, None]  # (R, V)
            found = best_continuations_by_top_k(log_probs, scores, self.width)
        return (*found, added)


def history_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the self-attention buffers the step of ``model`` reads: bfloat16 where its linear
    maps multiply in bf16 (the keys and values are products of such maps; half the bytes to read at
    every step), float32 otherwise."""
    return torch.bfloat16 if linear_precision(model) == "bf16" else torch.float32


def example(model: EncoderDecoder, beams: int, checked: bool = False) -> tuple[tuple[Tensor, ...], tuple]:
    """Inputs to trace with (sizes all different, so that none is taken for another) and their
    dynamic sizes: sources N, rows R = N·beams, buffer slots P, cached length T, source length; with
    ``checked`` (:class:`CheckStep`, ``beams`` 1), the new tokens per row C too."""
    from torch.export import Dim

    c = model.config
    n, h, d_k = len(model.new_cache().layers), c.h, c.d_model // c.h  # (a draft decoder's: its own layers)
    sources, length, source_len = 6, 5, 9
    rows = sources * beams
    slots = rows + 11
    dtype = history_dtype(model)
    inputs = (
        torch.randint(4, 20, (rows, 3 if checked else 1)),
        torch.randint(0, slots, (rows, length)),
        torch.randint(0, length, (rows,)),
        torch.ones(rows, 1, source_len, dtype=torch.bool),
        torch.randn(length, 2 * n, slots, h, d_k, dtype=dtype),
    )
    ranking = ()  # beam search's step ranks too (RankedStep): the beams' scores, the bounds, the tokens
    if beams > 1:
        allowed = torch.ones(2, model.tgt_vocab, dtype=torch.bool)
        ranking = (torch.randn(sources, beams), torch.rand(rows) < 0.5, allowed)
    inputs += ranking + tuple(torch.randn(sources, h, source_len, d_k) for _ in range(2 * n))
    N = Dim("sources", min=1, max=4096)
    R = N * beams if beams > 1 else N
    # a cached length leaves room for the new position; a source has at most max_len tokens
    cached, source = Dim("cached", min=1, max=c.max_len - 1), Dim("source_len", min=1, max=c.max_len)
    history = {0: cached, 2: Dim("slots", min=1, max=4096 * beams)}
    new = {0: R, 1: Dim("checked", min=2, max=c.max_len - 1)} if checked else {0: R}
    shapes = (new, {0: R, 1: cached}, {0: R}, {0: R, 2: source}, history)
    shapes += ({0: N}, {0: R}, None) if ranking else ()
    return inputs, (*shapes, tuple([{0: N, 2: source}] * (2 * n)))


def first_example(model: EncoderDecoder) -> tuple[tuple[Tensor, ...], tuple]:
    """Inputs to trace :class:`FirstStep` with and their dynamic sizes: sources N, source length."""
    from torch.export import Dim

    sources, source_len = 6, 9
    inputs = (torch.randint(4, 20, (sources, source_len)), torch.full((sources, 1), 2))
    N, S = Dim("sources", min=1, max=4096), Dim("source_len", min=1, max=model.config.max_len)
    return inputs, ({0: N, 1: S}, {0: N})
