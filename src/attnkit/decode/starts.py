"""Where every search starts: texts or prompts made into a search ready to step, for batch decoding
(``translate``, ``generate``) and a server's running batches (``continuous``) alike, so that a sentence
starts the same way whichever of them decodes it (docs/invariance.md).

- Sources: cut to the model's positions (or a summariser's shorter limit), ``</s>`` added
  (:func:`encode_sources`); padded on the right to the multiple their decoding needs, each searched
  from ``<s>`` within its length bound (:func:`ready_sources`), by the compiled steps of
  ``decode.steps`` where they are had, else by the model's own (:func:`source_decoding`).
- Every search runs its model in eval mode, on a CPU with attnkit's kernels (:func:`searching`,
  :func:`with_search_kernels`; a running batch's for as long as it serves, :func:`serving`; a
  trainer's model keeps its kernels, :func:`kernels_chosen_by_training`).
- Prompts: checked to leave room to continue (:func:`encode_prompts`), padded on the left so that
  the newest tokens align, each bounded by ``decode.max_new_tokens`` within the model's context
  (:func:`ready_prompts`), each sampled from its own generator (:func:`prompt_sampler`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.attention.invariance import KEY_BUCKET
from attnkit.config import DecodeConfig
from attnkit.cpu import speed_up
from attnkit.cpu.compiled.build import missing_compiler
from attnkit.data.batching import pad
from attnkit.data.tokenizer import SpecialIds, Tokenizer
from attnkit.decode.compiled import WIDTH_BUCKET, compiled_decoding
from attnkit.decode.sampling import Generators, sampler
from attnkit.decode.search import Choose, Decoding, Search, starts_of
from attnkit.decode.streams import serial_steps
from attnkit.errors import AttnkitError
from attnkit.models import evaluating
from attnkit.models.decoder_only import DecoderModel
from attnkit.models.decoding import Seq2SeqDecoding
from attnkit.models.seq2seq import EncoderDecoder

# decode.steps=auto builds compiled steps for an input of this many sentences: on 2 cores, building the
# first step and beam 5's for the README's 15-minute Multi30k model took 54 s, and they saved 1.06 ms a
# sentence (5.33 against 4.27 ms, bf16, 1,000 test sentences), so they repay themselves after about
# 51,000 sentences (the saving is Python's cost per step, about the same for a larger model)
REPAYING_SENTENCES = 50_000
# what the model's own steps cost against compiled ones (docs/benchmarks.md, beam 5 in bf16)
EAGER_COST = "about 1.25 times as long as compiled ones (beam 5)"


_SETTLED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # models whose kernels are chosen
_SETTLING = threading.Lock()  # (a server's threads may search one model at once)


def with_search_kernels(model: torch.nn.Module) -> None:
    """Give ``model`` attnkit's CPU kernels (:func:`attnkit.cpu.speed_up`, in place, the first time it
    is searched: the same weights, which loading and training give a model already), unless its
    trainer chose its kernels (:func:`kernels_chosen_by_training`). torch's own ``F.linear`` sums in an
    order that depends on the number of rows and threads, so a model searched as it was built would
    answer a sentence differently in another batch (docs/invariance.md)."""
    with _SETTLING:
        if model not in _SETTLED:  # (a walk over the modules: 1.7 ms for paper-base, not every request)
            speed_up(model)
            _SETTLED.add(model)


def kernels_chosen_by_training(model: torch.nn.Module) -> None:
    """Searches of ``model`` (a trainer's validation) leave its kernels as training chose them: a
    sharded model trains on torch's own, and changing them at the first validation would make a
    resumed run compute otherwise than the run it resumes (batch invariance is for inference)."""
    with _SETTLING:
        _SETTLED.add(model)


def serving(model: torch.nn.Module) -> None:
    """``model`` in eval mode with attnkit's kernels (:func:`with_search_kernels`) from now on: what a
    running batch does to its model when made, as :func:`searching` does for a search, but for as long
    as it serves (it has no end at which to give the model its former mode back)."""
    with_search_kernels(model)
    model.eval()


@contextmanager
def searching(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` in eval mode for a search, with attnkit's kernels (:func:`with_search_kernels`)."""
    with_search_kernels(model)
    with evaluating(model):
        yield model


@dataclass(frozen=True)
class ReadySearch:
    """What a search steps from: the rows' ``decoding``, their first ``tokens (B, t)`` (``<s>``, or a
    left-padded prompt) and each row's bound on the tokens it may add, ``limits (B,)``."""

    decoding: Decoding
    tokens: Tensor
    limits: Tensor


# --- sources (an encoder-decoder's) --------------------------------------------------------------


def cut_sources(sources: list[list[int]], limit: int) -> tuple[list[list[int]], int]:
    """Each source's first ``limit - 1`` tokens (room for ``</s>``), and how many were longer."""
    return [ids[: limit - 1] for ids in sources], sum(len(ids) > limit - 1 for ids in sources)


def encode_sources(
    tokenizer: Tokenizer,
    texts: list[str],
    longest: int,
    source_limit: int | None = None,
    warn: Callable[[str], None] | None = None,
    first_line: int = 1,
) -> list[list[int]]:
    """Each text's ids as the model reads them: cut to fit ``longest`` positions (a summariser's
    ``source_limit``: shorter), then ``</s>``. ``warn`` hears how many were cut, and why, naming the
    first by its line (``first_line`` for ``texts[0]``)."""
    limit = longest if source_limit is None else min(source_limit, longest)  # tokens with </s>
    encoded = tokenizer.encode_batch(texts)
    cut, count = cut_sources(encoded, limit)
    if count and warn is not None:
        at = next(i for i, ids in enumerate(encoded) if len(ids) > limit - 1)
        first = f"(line {at + first_line}: {len(encoded[at])} tokens)"
        if limit < longest:
            warn(
                f"{count} input line(s) are longer than the {limit} source tokens the model was "
                f"trained on (data.max_source_len) {first}; they are cut to {limit - 1} tokens, as in "
                "training"
            )
        else:
            warn(
                f"{count} input line(s) have more tokens than the model's {longest} positions "
                f"{first}; they are cut to {longest - 1} tokens, and outputs stop at {longest} tokens"
            )
    return [[*ids, tokenizer.specials.eos] for ids in cut]


@dataclass(frozen=True)
class SourceDecoding:
    """How an encoder-decoder's sources are decoded: ``decoding(src, use_cache)`` (``model.decoding``,
    or ``decode.steps``' compiled steps) and the multiple ``bucket`` their batches are padded to,
    the one each source is padded to alone (compiled steps: :data:`WIDTH_BUCKET`; the model's own:
    ``KEY_BUCKET``); either way a source gets its own bits beside sources of any width."""

    decoding: Callable[[Tensor, bool], Decoding]
    compiled: bool
    # where drafts are checked with the model's draft decoder: its decoding of the sources over the
    # model's memory, ``draft(src, memory)`` (compiled steps where the model's are)
    draft: Callable[[Tensor, Tensor], Seq2SeqDecoding] | None = None
    # whether its compiled steps include the check of drafts (``source_decoding``'s ``drafted``)
    checks: bool = False

    @property
    def bucket(self) -> int:
        return WIDTH_BUCKET if self.compiled else KEY_BUCKET


def source_decoding(
    model: EncoderDecoder,
    decode: DecodeConfig,
    beam: int,
    device: torch.device | str,
    specials: SpecialIds,
    warn: Callable[[str], None] | None = None,
    sentences: int = 0,
    drafted: bool = False,
) -> SourceDecoding:
    """How sources searched with ``beam`` rows each are decoded (``decode.steps``): compiled steps on a
    CPU where they can be had (``warn`` hears why not, where not), the model's own otherwise. With
    ``auto``, compiled steps are built for an input of at least :data:`REPAYING_SENTENCES`
    ``sentences`` (the build's time, once, repaid by this input alone); a smaller one takes them where
    they are built already (by an earlier large input, or a server). ``drafted``: greedy search checks
    drafts (``decode.speculative``), so the steps include the check of several tokens, and the model's
    draft decoder, where it has one, decodes with steps of its own."""
    compiled = draft = None
    if decode.steps != "eager" and torch.device(device).type == "cpu":
        build = decode.steps == "compiled" or sentences >= REPAYING_SENTENCES
        missing = missing_compiler() if build and decode.steps == "auto" else None
        if missing:
            if warn is not None:
                warn(f"decode.steps=auto: {missing}; the model's own steps take {EAGER_COST}")
        else:
            with evaluating(model):  # the steps are traced in eval mode
                serial = serial_steps(decode.streams)
                compiled = compiled_decoding(model, beam, warn, specials.bos, build, serial, drafted)
                if compiled is not None and drafted and model.draft is not None:
                    draft = compiled_decoding(model.draft, 1, warn, None, build, serial, checks=True)
    return SourceDecoding(
        compiled or model.decoding, compiled is not None, _drafting(model, drafted, draft), drafted
    )


def _drafting(
    model: EncoderDecoder, drafted: bool, compiled: Callable[..., Seq2SeqDecoding] | None
) -> Callable[[Tensor, Tensor], Seq2SeqDecoding] | None:
    """The draft's decoding of sources (``SourceDecoding.draft``): a draft decoder's over the model's
    memory, another checkpoint's model over its own encoder's; its ``compiled`` steps', or its own;
    None where there are no drafts of a draft model."""
    draft = getattr(model, "draft", None) if drafted else None  # (the RNN models have none)
    if draft is None:
        return None
    own_memory = isinstance(draft, EncoderDecoder)  # another checkpoint's model encodes for itself
    if compiled is not None:
        return lambda src, memory: compiled(src, True, None if own_memory else memory)
    return lambda src, memory: Seq2SeqDecoding(
        draft, src, use_cache=True, memory=None if own_memory else memory
    )


def ready_sources(
    model: EncoderDecoder,
    sources: list[list[int]],
    how: SourceDecoding,
    specials: SpecialIds,
    search: Search,
    device: torch.device | str,
) -> ReadySearch:
    """A search of ``sources`` (ids with ``</s>``) from ``<s>``, each within its length bound: padded to
    ``how.bucket`` as each is padded alone, encoded once (now)."""
    src = pad(sources, specials.pad, how.bucket, model.config.max_len).to(device)  # (B, S)
    start, limits = starts_of(src, specials, search)
    return ReadySearch(how.decoding(src, True), start, limits)


# --- prompts (a decoder's) ----------------------------------------------------------------------


def encode_prompts(tokenizer: Tokenizer, prompts: list[str], context: int, first: int = 0) -> list[list[int]]:
    """Each prompt's ids; a one-line error for an empty prompt, or one that fills the model's
    ``context`` (its positions, prompt and continuation together) and leaves no room to continue
    (naming it by its number, ``first + 1`` for ``prompts[0]``)."""
    encoded = tokenizer.encode_batch(prompts)
    for i, ids in enumerate(encoded, start=first + 1):
        if not ids:
            raise AttnkitError(f"prompt {i} is empty: give the model at least one character to continue")
        if len(ids) >= context:
            raise AttnkitError(
                f"prompt {i} has {len(ids)} tokens, but the model's context is {context} tokens "
                "(prompt and continuation together): shorten the prompt"
            )
    return encoded


def room(prompt: list[int], decode: DecodeConfig, context: int) -> int:
    """How many tokens may follow ``prompt``: ``decode.max_new_tokens``, within the model's context."""
    return min(decode.max_new_tokens, context - len(prompt))


def ready_prompts(
    model: DecoderModel,
    prompts: list[list[int]],
    pad_id: int,
    decode: DecodeConfig,
    device: torch.device | str,
) -> ReadySearch:
    """A continuation of ``prompts`` (ids), left-padded (their padding takes no position and is masked,
    so each goes on as alone), each bounded by its :func:`room`, then ``</s>``."""
    longest = max(map(len, prompts))
    tokens = pad([[pad_id] * (longest - len(p)) + p for p in prompts], pad_id).to(device)  # (B, P)
    valid = torch.tensor([[False] * (longest - len(p)) + [True] * len(p) for p in prompts], device=device)
    rooms = [room(p, decode, model.config.max_len) for p in prompts]
    limits = torch.tensor(rooms, device=device) + 1  # up to `room` tokens, then </s> ends the row
    return ReadySearch(model.decoding(valid), tokens, limits)


def prompt_sampler(generators: Generators, decode: DecodeConfig) -> Choose:
    """How the rows' next tokens are chosen: ``decode``'s sampling (greedy at temperature 0), row ``i``
    drawing from ``generators[i]`` (its own, seeded with its seed)."""
    return sampler(generators, decode.temperature, decode.top_k, decode.top_p)
