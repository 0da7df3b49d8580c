"""``--engine ctranslate2``: translating and generating with CTranslate2 from a folder that ``attnkit
export --to ctranslate2`` wrote, tokenised and detokenised by attnkit's own tokenizer.

:class:`CTranslate2Translator` (a translation model, ``attnkit translate`` and ``evaluate``). What matches
attnkit's search: the source is the tokens followed by ``</s>``; the decoder starts from ``<s>`` (set at
export); ``<pad>`` and ``<s>`` are never produced; the output stops at ``</s>``; an empty line gives an
empty line; the batches are attnkit's; finished hypotheses rank by ``log P / length^α``
(``decode.alpha``). What differs: CTranslate2 has no GNMT length penalty (``decode.length_penalty=gnmt``)
nor a choice of stopping rule; it bounds the output length per batch (``a · longest source + b``)
rather than per sentence, and cuts a hypothesis at the bound where attnkit's ends it with ``</s>``.
``translate_n_best`` gives CTranslate2's scores, ``log P'(Y) / |Y|^α`` as attnkit's but with P' the
model's distribution without ``<pad>`` and ``<s>`` (CTranslate2 takes them out before the softmax,
attnkit after it, keeping true log-probabilities), and a hypothesis cut at the bound scored without
``</s>``; an output left empty by a bound of one token is scored ``log P(</s>)``, as attnkit scores it.

:class:`CTranslate2Generator` (a GPT-style decoder, ``attnkit generate``, and ``evaluate --data
FILE.txt``: the perplexity of a text, read in the same blocks as attnkit's). What matches: the prompts and
their batches, at most ``decode.max_new_tokens`` new tokens within the model's context, ``<pad>`` and
``<s>`` never produced (unless one is also ``</s>``), the end at ``</s>`` or at a ``decode.stop`` string,
greedy search exactly (``decode.temperature=0``), and sampling from the same distribution
(``temperature``, ``top_k``, ``top_p``). What differs: CTranslate2 draws from its own random generator,
seeded once with ``decode.seed`` when the model loads, so a run repeats itself with the same prompts and
one stream, but a prompt's sample depends on the prompts before it; and it finds stop strings only
afterwards (the text is cut where the first one appears, as attnkit's).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import torch

from attnkit.checkpoint.ctranslate2_folder import DECODE_FILE, ctranslate2_command, exported_model
from attnkit.config import DecodeConfig, with_decode_overrides
from attnkit.data.batching import length_batches
from attnkit.data.text_blocks import stream_blocks, text_ids
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.generate import NOBODY, Listening, OnText, TextStream
from attnkit.decode.search import BeamSettings, Translation
from attnkit.decode.starts import encode_prompts, room
from attnkit.decode.streams import stream_count
from attnkit.errors import AttnkitError
from attnkit.metrics import perplexity
from attnkit.models import ARCHITECTURES, DecoderModelConfig, TransformerConfig
from attnkit.utf8 import native_path


def check_exported_folder(folder: Path) -> None:
    """A one-line error unless CTranslate2 is installed and ``folder`` is what ``attnkit export --to
    ctranslate2`` writes."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise AttnkitError(
            "--engine ctranslate2 needs CTranslate2: pip install 'attnkit[ctranslate2]'"
        ) from None
    if not (folder / DECODE_FILE).is_file() or not (folder / "model.bin").is_file():
        raise AttnkitError(f"{folder}: not a CTranslate2 folder from 'attnkit export --to ctranslate2'")


def exported_decode(folder: Path, overrides: Sequence[str] = ()) -> DecodeConfig:
    """The decoding settings a CTranslate2 folder was exported with, changed by ``decode.field=value``
    overrides (checked as a config file's are)."""
    exported = DecodeConfig(**json.loads((folder / DECODE_FILE).read_text(encoding="utf-8")))
    return with_decode_overrides(exported, list(overrides))


class _ExportedFolder:
    """The CTranslate2 model, tokenizer and decoding settings of ``folder``, loaded once. ``overrides``
    (``decode.field=value``) change the folder's decoding settings, as they change a checkpoint's for
    attnkit's own search, and ``changes`` (``{"field": value}``) after them. ``decode.streams`` is
    CTranslate2's ``inter_threads``: batches run at a time, each on its share of torch's threads, as
    attnkit's own (decode/streams.py); fixed when the model loads."""

    ARCH: ClassVar[str]  # the architecture this engine runs

    def __init__(
        self, folder: Path, overrides: Sequence[str] = (), changes: Mapping[str, Any] | None = None
    ) -> None:
        check_exported_folder(folder)
        import ctranslate2

        held = exported_model(folder)
        if held["arch"] != self.ARCH:
            what = ARCHITECTURES[held["arch"]].kind.split(" ", 1)[1]  # "a translation model": its noun
            raise AttnkitError(
                f"{folder}: a CTranslate2 {what}; use it with {ctranslate2_command(folder, held['arch'])}"
            )
        self.context: int | None = held.get("context")
        self.tokenizer = Tokenizer.load(folder / "tokenizer.json")
        self.decode = replace(exported_decode(folder, overrides), **(changes or {}))
        threads = torch.get_num_threads()
        self.streams = stream_count(self.decode.streams, "cpu", threads)
        self.model = self._load(ctranslate2, native_path(folder), inter_threads=self.streams,
                                intra_threads=threads // self.streams)  # fmt: skip
        # CTranslate2 sets the loading thread's OpenMP threads to its intra_threads, which is torch's count
        # too: left so, every torch operation of this thread after it would run on that share alone
        torch.set_num_threads(threads)

    def _load(self, ctranslate2: Any, folder: str, **threads: int) -> Any:
        raise NotImplementedError

    def _token_names(self, ids: Sequence[int]) -> list[str]:
        return [self.tokenizer.hf.id_to_token(i) for i in ids]

    def _ids(self, names: Sequence[str]) -> list[int]:
        return [self.tokenizer.hf.token_to_id(name) for name in names]

    def _never_produced(self) -> list[list[str]]:
        """``<pad>`` and ``<s>``, as attnkit's search never produces them (unless one is ``</s>``)."""
        s = self.tokenizer.specials
        return [self._token_names([i]) for i in sorted({s.pad, s.bos} - {s.eos})]


class CTranslate2Translator(_ExportedFolder):
    """A translation model's folder (see the module docstring); ``translate`` as often as needed. ``warn``
    hears of a decoding setting CTranslate2 cannot follow."""

    ARCH = TransformerConfig.ARCH

    def __init__(
        self, folder: Path, overrides: Sequence[str] = (), warn: Callable[[str], None] | None = None
    ) -> None:
        super().__init__(folder, overrides)
        if self.decode.length_penalty != "length" and warn is not None:
            warn(
                f"CTranslate2 ranks hypotheses by log P / length^α; decode.length_penalty="
                f"{self.decode.length_penalty} is attnkit's search only"
            )

    def _load(self, ctranslate2: Any, folder: str, **threads: int) -> Any:
        return ctranslate2.Translator(folder, device="cpu", **threads)

    def translate(
        self, texts: list[str], beam_size: int | None = None, progress: Callable[[int], None] | None = None
    ) -> list[str]:
        """Translate ``texts``; ``beam_size`` 1 is greedy, default the run's ``decode.beam_size``. The
        batches are attnkit's (``decode.batch_size`` sentences of similar length), each with its own
        length bound, submitted at once so that ``decode.streams`` of them run at a time. ``progress``
        hears how many more lines are done, batch by batch."""
        found = self._hypotheses(texts, beam_size, 0, progress)
        return [hypotheses[0][0] if hypotheses else "" for hypotheses in found]

    def translate_n_best(
        self,
        texts: list[str],
        n_best: int,
        beam_size: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[Translation]]:
        """The ``n_best`` best translations of each text with their scores and token counts, best first
        (none for an empty line), as attnkit's ``translate`` with ``n_best``, with CTranslate2's scores
        (see the module docstring). Otherwise as :meth:`translate`."""
        return self._hypotheses(texts, beam_size, n_best, progress)

    def _hypotheses(
        self, texts: list[str], beam_size: int | None, n_best: int, progress: Callable[[int], None] | None
    ) -> list[list[Translation]]:
        """Each text's hypotheses, their scores and token counts, best first: the best alone and unscored
        (``n_best`` 0), or ``n_best`` of them, scored."""
        tokenizer, decode = self.tokenizer, self.decode
        beam = BeamSettings(decode.beam_size if beam_size is None else beam_size, max(n_best, 1)).beam
        eos = self._token_names([tokenizer.specials.eos])
        sources = [self._token_names(ids) + eos for ids in tokenizer.encode_batch(texts)]
        todo = [i for i, text in enumerate(texts) if text.strip()]
        found: list[list[Translation]] = [[] for _ in texts]
        pending = []
        for batch in length_batches(todo, [len(source) for source in sources], decode.batch_size):
            # attnkit's bound counts the </s> that ends an output, CTranslate2's does not
            words = int(decode.max_len_a * max(len(sources[i]) for i in batch) + decode.max_len_b) - 1
            if words < 1:  # room for </s> alone: empty outputs, scored (if asked) by the probability of </s>
                scores = [float("nan")] * len(batch)
                if n_best:
                    ended = self.model.score_batch([sources[i] for i in batch], [[]] * len(batch))
                    scores = [sum(result.log_probs) for result in ended]
                for i, score in zip(batch, scores, strict=True):
                    found[i] = [Translation("", score, 0)]
                continue
            results = self.model.translate_batch(
                [sources[i] for i in batch],
                asynchronous=True,
                beam_size=beam,
                num_hypotheses=max(n_best, 1),
                return_scores=n_best > 0,
                length_penalty=decode.alpha,
                max_decoding_length=words,
                min_decoding_length=0,  # an output may be empty, as in attnkit's search
                suppress_sequences=self._never_produced(),
            )
            pending.append((batch, results))
        if progress is not None:
            progress(len(texts) - sum(len(batch) for batch, _ in pending))  # the lines left empty
        for batch, results in pending:
            for i, result in zip(batch, results, strict=True):
                result = result.result()
                scores = result.scores if n_best else [float("nan")]
                found[i] = [
                    Translation(tokenizer.decode(self._ids(hypothesis)), score, len(hypothesis))
                    for hypothesis, score in zip(result.hypotheses, scores, strict=True)
                ]
            if progress is not None:
                progress(len(batch))
        return found


class CTranslate2Generator(_ExportedFolder):
    """A decoder (GPT-style) model's folder (see the module docstring); ``generate`` as often as needed."""

    ARCH = DecoderModelConfig.ARCH

    def _load(self, ctranslate2: Any, folder: str, **threads: int) -> Any:
        ctranslate2.set_random_seed(self.decode.seed)  # CTranslate2 seeds its threads' generators now
        return ctranslate2.Generator(folder, device="cpu", **threads)

    def _settings(self) -> dict[str, Any]:
        """Greedy (``temperature`` 0) or sampling, in CTranslate2's terms (top-k 0: the whole vocabulary)."""
        d = self.decode
        chosen = {"sampling_topk": 1}
        if d.temperature > 0:
            chosen = {
                "sampling_topk": d.top_k,
                "sampling_topp": d.top_p,
                "sampling_temperature": d.temperature,
            }
        return {**chosen, "suppress_sequences": self._never_produced()}

    def generate(
        self,
        prompts: list[str],
        listening: Listening = NOBODY,
        progress: Callable[[int], None] | None = None,
        first: int = 0,
    ) -> list[str]:
        """The continuation of each prompt (without the prompt itself), as attnkit's ``generate``:
        ``listening.on_text(i, new_text)`` hears each prompt's text as it comes (one prompt at a time,
        then), and ``listening.wanted(i)`` is asked after each streamed token whether prompt i's
        continuation is still wanted (a server's client may have gone); ``progress`` hears how many
        more are done, batch by batch; ``first``: the number of ``prompts[0]`` among all, for the
        errors."""
        decode, context = self.decode, self.context
        encoded = encode_prompts(self.tokenizer, prompts, context, first)
        if listening.on_text is not None:
            return [
                self._streamed(i, ids, listening.on_text, listening.wanted) for i, ids in enumerate(encoded)
            ]
        pending = []
        for batch in length_batches(range(len(prompts)), [len(ids) for ids in encoded], decode.batch_size):
            # CTranslate2 returns each prompt and its continuation, max_length tokens after the prompt's
            # first: enough for every prompt's room, each continuation then cut to its own
            length = max(len(encoded[i]) - 1 + room(encoded[i], decode, context) for i in batch)
            results = self.model.generate_batch(
                [self._token_names(encoded[i]) for i in batch],
                asynchronous=True,
                max_length=length,
                include_prompt_in_result=True,
                **self._settings(),
            )
            pending.append((batch, results))
        outputs = [""] * len(prompts)
        for batch, results in pending:
            stream = TextStream(self.tokenizer, decode.stop, list(batch), None)
            for row, (i, result) in enumerate(zip(batch, results, strict=True)):
                continuation = result.result().sequences[0][len(encoded[i]) :]
                outputs[i] = stream.finish(row, self._ids(continuation[: room(encoded[i], decode, context)]))
            if progress is not None:
                progress(len(batch))
        return outputs

    def perplexity(self, text: str) -> dict[str, float]:
        """The model's cross-entropy (nats per token) and perplexity on ``text``, in the blocks attnkit
        reads it in (``stream_blocks``: consecutive blocks of the model's context), ``decode.batch_size``
        blocks a batch; ``tokens``: how many were predicted. As attnkit's ``text_perplexity``."""
        ids = text_ids(self.tokenizer, text)
        pending = []
        for blocks in stream_blocks(ids, self.context, self.decode.batch_size):
            rows = torch.cat([blocks.inputs[:, :1], blocks.targets], dim=1).tolist()  # each block's tokens
            names = [self._token_names(row) for row in rows]
            pending.append(self.model.score_batch(names, max_input_length=0, asynchronous=True))  # 0: whole
        nll = -sum(sum(result.result().log_probs) for results in pending for result in results)
        tokens = len(ids) - 1
        return {"loss": nll / tokens, "perplexity": perplexity(nll / tokens), "tokens": tokens}

    def _streamed(
        self, index: int, prompt: list[int], on_text: OnText, wanted: Callable[[int], bool] | None
    ) -> str:
        """One prompt's continuation, token by token to ``on_text``, ended at a stop string (or once it
        is no longer ``wanted``)."""
        stream = TextStream(self.tokenizer, self.decode.stop, [index], on_text, wanted)
        generated: list[int] = []
        steps = self.model.generate_tokens(
            self._token_names(prompt),
            max_length=room(prompt, self.decode, self.context),
            **self._settings(),
        )
        for step in steps:
            if step.token_id == self.tokenizer.specials.eos:
                break
            generated.append(step.token_id)
            if bool(stream.observe(torch.tensor([generated]))[0]):
                break
        return stream.finish(0, generated)
