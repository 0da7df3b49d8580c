"""Searches that take a model's compiled decoding step (``decode.steps``, attnkit.cpu.compiled).

:class:`CompiledDecoding` is the model's own decoding (``model.decoding(src)``) with ``next_logits``
swapped: the steps after the first, one new token per row at the step's beam width, run the compiled
step; every other step runs the model as usual. The model knows nothing of it. Beam search's compiled
step ranks the continuations too (``ranked``, which ``decode/search.py``'s ``best_continuations``
asks first): the search reads each source's best 2K rather than every row's logits. Greedy search
that checks drafts (decode/speculative.py) takes a compiled check step too, for steps of several new
tokens a row (``checked_logits``, ``rewind``), as does a shallow draft decoder's decoding.

From the first compiled step on, the self-attention's keys and values live in a :class:`History`
(buffers of one position per row and slots saying whose, as the compiled step reads them: see
``attnkit.cpu.compiled.trace``): a step writes one new position into it, and beam search's
reordering and dropped sentences move slots, not keys. Where a step must run eagerly after all, the
keys go back into the model's own cache first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnkit.attention.multihead import KVCache
from attnkit.cpu.compiled.build import CHECK_STEP, FIRST_STEP, compilable, missing_compiler
from attnkit.cpu.compiled.cache import cache_folder
from attnkit.cpu.compiled.library import CompiledStep
from attnkit.cpu.compiled.steps import all_built, compiled_step, to_build, weights_fingerprint
from attnkit.cpu.compiled.trace import history_dtype
from attnkit.data.tokenizer import SpecialIds
from attnkit.decode.search import never_generated
from attnkit.models.decoding import Seq2SeqDecoding
from attnkit.models.draft import ShallowDraft
from attnkit.nn.transformer import DecoderCache

if TYPE_CHECKING:
    from attnkit.models.seq2seq import EncoderDecoder

# Sources decoded by compiled steps are padded only to their batch's widest (a multiple of 1): the
# steps' attention pads its keys to whole vectors of the compiler's sums itself (cpu/attention.py
# attend_as_sums), which gives a source the same bits at any width, while the encoder's other work
# (the projections, the feed-forward layers) runs on no padded position it need not
# (docs/invariance.md; tests/decode/test_batch_invariance.py holds it).
WIDTH_BUCKET = 1


class History:
    """Every layer's self-attention keys and values of the positions decoded so far, as the compiled
    step reads them (``attnkit.cpu.compiled.trace``): ``buffer (capacity, 2·layers, P, h, d_k)``,
    position t of the rows at ``[start + t]`` (layer i's keys at ``[·, i]``, its values at ``[·,
    layers + i]``: the positions so far are one contiguous block); and ``slots (R, T)``, the slot of
    ``[start + t]`` that holds row r's position t. ``used[t]``: the slots of ``[start + t]`` taken so
    far (rows that join a running batch take fresh ones, :meth:`merge`)."""

    def __init__(self, cache: DecoderCache, dtype: torch.dtype) -> None:
        """Take the keys and values over from ``cache`` (whose self-attention caches are emptied)."""
        held = _keys_then_values(cache)
        R, h, T, d_k = held[0].shape
        # room for 64 positions (most outputs; the pages are touched only as positions are written),
        # doubled whenever full
        self.buffer = held[0].new_empty((max(2 * T, 64), len(held), R, h, d_k), dtype=dtype)
        for i, kept in enumerate(held):
            self.buffer[:T, i] = kept.permute(2, 0, 1, 3)  # (R, h, T, d_k) -> (T, R, h, d_k)
        for layer in cache.layers:
            layer.self_attn = KVCache()
        self.slots = torch.arange(R, device=self.buffer.device)[:, None].repeat(1, T)  # (R, T): its own row
        self.start, self.used = 0, [R] * T

    def __len__(self) -> int:
        return self.slots.size(1)

    def step_inputs(self) -> tuple[Tensor, Tensor]:
        """The slots and the positions so far, as the step takes them."""
        return self.slots, self.buffer[self.start : self.start + len(self)]

    def extend(self, added: Tensor) -> None:
        """Add the position a step computed, ``(2·layers, R, h, d_k)``, or the ``C`` positions a check
        step computed, ``(2·layers, R, C, h, d_k)``: row r's in slot r."""
        added = added if added.dim() == 5 else added[:, :, None]  # (2·layers, R, C, h, d_k)
        T, R, C = len(self), self.slots.size(0), added.size(2)
        self._make_room(R)
        while self.start + T + C > self.buffer.size(0):  # full: the positions no row reads go, or twice
            if self.start:  # as many
                self.buffer[:T] = self.buffer[self.start : self.start + T].clone()
                self.start = 0
            else:
                self.buffer = torch.cat([self.buffer, torch.empty_like(self.buffer)])
        self.buffer[self.start + T : self.start + T + C, :, :R] = added.permute(2, 0, 1, 3, 4)
        own = torch.arange(R, device=self.slots.device)[:, None].expand(R, C)
        self.slots = torch.cat([self.slots, own], dim=1)  # (R, T + C)
        self.used += [R] * C

    def drop_last(self, count: int) -> None:
        """Forget the last ``count`` positions of every row (a draft's tokens no row took)."""
        if count:
            self.slots, self.used = self.slots[:, :-count], self.used[:-count]

    def select(self, index: Tensor) -> None:
        """Keep rows ``index`` (in that order): beam search's reordering, or dropped rows."""
        self.slots = self.slots.index_select(0, index)

    def forget(self, count: int) -> None:
        """Drop the first ``count`` positions of every row (no row reads them any more)."""
        self.slots, self.start, self.used = self.slots[:, count:], self.start + count, self.used[count:]

    def merge(self, cache: DecoderCache) -> None:
        """Add the rows whose keys and values ``cache`` holds, ``(R', h, t, d_k)`` with t at most
        ``len(self)``, after these (its self-attention caches are emptied): their positions go to the
        last t positions, in slots no row reads, and the earlier positions are padding to them (their
        slots point anywhere; the step masks them)."""
        held = torch.stack(_keys_then_values(cache))  # (2·layers, R', h, t, d_k)
        added, t, T = held.size(1), held.size(3), len(self)
        if not 0 < t <= T:
            raise ValueError(f"rows of {t} positions cannot join a history of {T}")
        self._make_room(max(self.used[T - t :]) + added)
        slots = self.slots.new_zeros((added, T))
        for j in range(t):
            at, taken = T - t + j, self.used[T - t + j]
            self.buffer[self.start + at, :, taken : taken + added] = held[:, :, :, j]
            slots[:, at] = torch.arange(taken, taken + added, device=slots.device)
            self.used[at] = taken + added
        for layer in cache.layers:
            layer.self_attn = KVCache()
        self.slots = torch.cat([self.slots, slots])  # (R + R', T)

    def _make_room(self, slots: int) -> None:
        """At least ``slots`` slots per position (twice as many as held, when more are needed)."""
        if slots > self.buffer.size(2):
            shape = list(self.buffer.shape)
            shape[2] = max(slots, 2 * shape[2])
            grown = self.buffer.new_empty(shape)
            live = slice(self.start, self.start + len(self))
            grown[live, :, : self.buffer.size(2)] = self.buffer[live]
            self.buffer = grown

    def give_back(self, cache: DecoderCache) -> None:
        """Put every row's keys and values into ``cache``, as the eager step reads them."""
        positions = self.start + torch.arange(len(self), device=self.slots.device)[None, :]  # (1, T)
        n = len(cache.layers)
        # (·, 2n, P, h, d_k) -> (R, T, 2n, h, d_k): each row's positions, gathered by their slots
        gathered = (
            self.buffer.transpose(1, 2)[positions, self.slots].transpose(1, 2).float()
        )  # (R, 2n, T, h, d_k)
        for i, layer in enumerate(cache.layers):
            key = gathered[:, i].transpose(1, 2).contiguous()  # (R, h, T, d_k)
            value = gathered[:, n + i].transpose(1, 2).contiguous()
            layer.self_attn = KVCache(key, value)


def _keys_then_values(cache: DecoderCache) -> list[Tensor]:
    """Every layer's self-attention keys, then every layer's values, ``(R, h, T, d_k)`` each."""
    return [layer.self_attn.key for layer in cache.layers] + [layer.self_attn.value for layer in cache.layers]


class CompiledDecoding(Seq2SeqDecoding):
    """``model.decoding(src)`` whose steps after the first, one new token per row at ``step``'s beam
    width, run the compiled step: greedy search's through :meth:`next_logits`, beam search's through
    :meth:`ranked` (its step ranks and returns no logits, so a beam-width decoding asked for logits
    decodes them eagerly); with a ``check`` step, greedy search's steps of several new tokens per row
    too (speculative decoding's checks, :meth:`checked_logits`, and a draft decoder's catching up);
    every other step (the first, which also computes the cross-attention keys, or another beam width)
    runs the model as usual."""

    def __init__(
        self,
        model: EncoderDecoder | ShallowDraft,
        src: Tensor,
        use_cache: bool,
        step: CompiledStep,
        beams: int,
        first: tuple[CompiledStep, int] | None = None,
        dtype: torch.dtype | None = None,
        check: CompiledStep | None = None,
        memory: Tensor | None = None,
    ):
        """``first``: the compiled first step and the start token it decodes after each source, which
        then encodes the sources here, and decodes the start token with them (its logits kept for the
        first :meth:`next_logits`); without it (or the cache) the model encodes them as usual, or takes
        their ``memory`` (a draft decoder's, the model's). ``dtype``: the history's (default:
        :func:`history_dtype` of the model, found now). ``check``: the compiled check step (greedy)."""
        self.step, self.step_beams, self.check = step, beams, check
        self.history_dtype = dtype or history_dtype(model)
        self.history: History | None = None
        self.first_logits: Tensor | None = None  # (N, V): the first step's, computed with the memory
        self.allowed: tuple[SpecialIds, Tensor] | None = None  # the ranking step's tokens ruled out
        if first is None or not use_cache:
            super().__init__(model, src, use_cache, memory=memory)
            return
        first_step, self.start_token = first
        start = torch.full((src.size(0), 1), self.start_token, dtype=src.dtype, device=src.device)
        logits, memory, *kept = first_step(src.contiguous(), start)
        super().__init__(model, src, use_cache, memory=memory)
        n = len(self.cache.layers)
        for i, layer in enumerate(self.cache.layers):
            layer.self_attn = KVCache(kept[i], kept[n + i])
            layer.src_attn = KVCache(kept[2 * n + i], kept[3 * n + i])
        self.first_logits = logits

    def next_logits(self, tokens: Tensor) -> Tensor:
        if self.first_logits is not None:  # the first step ran with the encoder: its logits, once
            logits, self.first_logits = self.first_logits, None
            if tokens.shape == (logits.size(0), 1) and bool((tokens == self.start_token).all()):
                return logits
            self.cache = self.model.new_cache()  # not the start token after each source: decode them
        new = self._new_tokens(tokens)
        if new > 1 and self.check is not None and self.step_beams == 1 and self.cache is not None:
            return self.checked_logits(tokens, new)[:, -1]  # several new tokens: the check step's last
        inputs = self._step_inputs(tokens) if self.step_beams == 1 else None  # (beam search's step ranks)
        if inputs is None:
            self._leave_history()
            return super().next_logits(tokens)
        new, cached, crossed = inputs
        logits, added = self.step(new, *cached, *crossed)
        self.history.extend(added)  # type: ignore[union-attr]
        return logits

    @property
    def checks_exactly(self) -> bool:  # type: ignore[override]
        """Whether checks take the compiled check step (built for greedy search that checks drafts), whose
        positions have the compiled steps' bits; without it a check runs the model's own layers."""
        return self.check is not None and self.step_beams == 1

    def checked_logits(self, tokens: Tensor, count: int) -> Tensor:
        """As ``Seq2SeqDecoding.checked_logits``, in the compiled check step (one token: the plain
        step; the start token: the first step's logits), where it takes this step; the same bits as
        the compiled step gives each position a token at a time
        (tests/decode/test_speculative_compiled.py)."""
        if self.first_logits is not None and count == tokens.size(1):  # the start token: the first step's
            head = self.next_logits(tokens[:, :1])[:, None]  # (R, 1, V)
            return head if count == 1 else torch.cat([head, self.checked_logits(tokens, count - 1)], 1)
        if count == 1:
            return self.next_logits(tokens)[:, None]  # (R, 1, V)
        inputs = self._step_inputs(tokens, count) if self.check is not None and self.step_beams == 1 else None
        if inputs is None:
            self._leave_history()
            return super().checked_logits(tokens, count)
        new, cached, crossed = inputs
        logits, added = self.check(new, *cached, *crossed)  # (R, count, V)
        self.history.extend(added)  # type: ignore[union-attr]
        return logits

    def rewind(self, kept: Tensor, checked: int) -> None:
        """As ``Seq2SeqDecoding.rewind``: where every row keeps as many positions, the history forgets
        the last (a step of one row, speculative decoding's usual); otherwise the rows are realigned in
        the model's cache, and the next step makes the history anew."""
        if self.history is not None and bool((kept == kept[0]).all()):
            self.history.drop_last(checked - int(kept[0]))
            return
        self._leave_history()
        super().rewind(kept, checked)

    def _new_tokens(self, tokens: Tensor) -> int:
        """How many of ``tokens (R, t)`` are not cached yet (all, without a cache)."""
        if self.history is not None:
            return tokens.size(1) - len(self.history)
        return tokens.size(1) - (len(self.cache) if self.cache is not None else 0)

    def ranked(
        self, tokens: Tensor, at_limit: Tensor, specials: SpecialIds, scores: Tensor, width: int
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        """``attnkit.decode.search.best_continuations``, ranked in the compiled step (``trace.RankedStep``)
        where it takes this step; None where the search must rank the logits itself (the first step,
        an eager one, another width)."""
        if self.first_logits is not None or self.step_beams == 1 or width != 2 * self.step_beams:
            return None
        inputs = self._step_inputs(tokens)
        if inputs is None:
            return None
        new, cached, crossed = inputs
        if self.allowed is None or self.allowed[0] != specials:  # (2, V): ever generated; </s> alone
            allowed = torch.ones(2, self.model.tgt_vocab, dtype=torch.bool)
            allowed[0, never_generated(specials)] = False
            allowed[1] = False
            allowed[1, specials.eos] = True
            self.allowed = (specials, allowed)
        best, beam, token, added = self.step(
            new, *cached, scores.contiguous(), at_limit, self.allowed[1], *crossed
        )
        self.history.extend(added)  # type: ignore[union-attr]
        return best, beam, token

    def _step_inputs(
        self, tokens: Tensor, count: int = 1
    ) -> tuple[Tensor, tuple[Tensor, ...], list[Tensor]] | None:
        """The compiled step's inputs for ``tokens``: the ``count`` new tokens ``(R, count)``; the slots,
        where each row's own positions begin, the source mask and the history; the cross-attention's
        keys and values. None where the step must run eagerly (not ``count`` new tokens, or another
        beam width)."""
        if self.history is not None and len(self.history) != tokens.size(1) - count:
            self._leave_history()  # not as many new tokens: the eager step, on the model's cache
        if self.history is None:
            cached = self.cache is not None and 0 < len(self.cache) == tokens.size(1) - count
            if not (cached and self.beams == self.step_beams):
                return None
            self.history = History(self.cache, self.history_dtype)
        layers = self.cache.layers
        crossed = [layer.src_attn.key.contiguous() for layer in layers]  # (the sources kept: applied)
        crossed += [layer.src_attn.value.contiguous() for layer in layers]
        slots, history = self.history.step_inputs()
        first = self._firsts()  # where each row's own positions begin
        return tokens[:, -count:].contiguous(), (slots, first, self.src_mask.contiguous(), history), crossed

    def merge(self, other: Seq2SeqDecoding) -> None:
        """As ``Seq2SeqDecoding.merge``; with the history already made, ``other``'s keys and values go
        into it (:meth:`History.merge`) rather than the history back into the model's cache."""
        if isinstance(other, CompiledDecoding):
            other._leave_history()
        if self.history is None or other.cache is None or len(other.cache) > len(self.history):
            self._leave_history()
            super().merge(other)
            return
        if self.beams != other.beams:
            raise ValueError("only cached decodings with as many rows per source merge")
        T, t = len(self.history), len(other.cache)
        first = torch.cat([self._firsts(), other._firsts() + T - t])
        self._merge_sources(other)
        self.history.merge(other.cache)
        self.first = first

    def _drop_positions(self, count: int) -> None:
        if self.history is not None:
            self.history.forget(count)
        else:
            super()._drop_positions(count)

    def reorder(self, index: Tensor) -> None:
        if self.history is None:
            super().reorder(index)
            return
        self.history.select(index)
        if self.first is not None:
            self.first = self.first.index_select(0, index)

    def keep(self, index: Tensor) -> int:
        if self.history is not None:
            self.history.select(index)
        return super().keep(index)  # (the model's self-attention caches are empty meanwhile)

    def repeat(self, times: int) -> None:
        self._leave_history()
        super().repeat(times)

    def _leave_history(self) -> None:
        if self.history is not None:
            self.history.give_back(self.cache)
            self.history = None


def compiled_decoding(
    model: EncoderDecoder | ShallowDraft,
    beams: int,
    warn: Callable[[str], None] | None = None,
    start_token: int | None = None,
    build: bool = True,
    serial: bool = True,
    checks: bool = False,
) -> Callable[..., CompiledDecoding] | None:
    """What searches of ``model`` with ``beams`` rows per source decode with to take its compiled steps
    (:func:`compiled_step`): ``decoding(src, use_cache, memory=None)``, as ``model.decoding``; None
    where there is no compiled step (the search then takes ``model.decoding``), or, without ``build``,
    where the steps are not built yet. With ``start_token`` (``<s>``, which every search decodes
    first), the first step, and the encoder with it, is compiled too; with ``checks`` (greedy search
    that checks drafts, or a draft decoder), the check step of several tokens per row too, and without
    it none are taken (a check in the model's own steps would not give the compiled step's bits):
    without ``build`` too, where the others are built.
    Steps are built with ``serial`` loops (for searches on one thread each) or parallel ones
    (``decode.streams``: decode/streams.py's ``serial_steps``); without ``build``, steps of either
    kind are taken."""
    widths = [FIRST_STEP, beams] if start_token is not None else [beams]
    widths += [CHECK_STEP] if checks else []
    # the weights' fingerprint, once (each call below would take it again); none for a model whose
    # steps cannot be compiled (they do not ask)
    fingerprint = weights_fingerprint(model) if compilable(model) else None
    if not build and not all_built(model, widths, fingerprint):
        if not (checks and all_built(model, widths[:-1], fingerprint)):
            return None
        # the plain steps are built, and a plain search would take them: the check step is built too,
        # so that drafts are checked with the bits of the steps a search without them takes
        build = True
    building = to_build(model, widths, serial, fingerprint) if warn is not None and build else []
    if building and missing_compiler() is None:  # (else compiled_step says why not)
        whose = "the draft decoder's" if isinstance(model, ShallowDraft) else "the"
        which = [f"{whose} decoding step of beam {beams}"] * (beams in building)
        which += ["the first step"] * (FIRST_STEP in building)
        which += [f"{whose} check step of drafts"] * (CHECK_STEP in building)
        warn(f"decode.steps: compiling {' and '.join(which)} (about 20 s each, once; kept in "
             f"{cache_folder()}; attnkit cache clear deletes them)")  # fmt: skip
    step = compiled_step(model, beams, serial, warn, build, fingerprint)
    check = compiled_step(model, CHECK_STEP, serial, warn, build, fingerprint) if checks and step else None
    if step is None or (checks and check is None):
        return None
    first_step = None
    if start_token is not None:
        first_step = compiled_step(model, FIRST_STEP, serial, warn, build, fingerprint)
    first = (first_step, start_token) if first_step is not None else None
    dtype = history_dtype(model)  # (once: a walk of the model's modules)

    def decoding(src: Tensor, use_cache: bool = True, memory: Tensor | None = None) -> CompiledDecoding:
        return CompiledDecoding(model, src, use_cache, step, beams, first, dtype, check, memory)

    return decoding
