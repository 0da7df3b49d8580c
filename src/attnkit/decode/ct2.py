"""``attnkit translate --engine ctranslate2``: translating with CTranslate2 from a folder that
``attnkit export --to ctranslate2`` wrote, tokenised and detokenised by attnkit's own tokenizer.

What matches attnkit's search: the source is the tokens followed by ``</s>``; the decoder starts from
``<s>`` (set at export); ``<pad>`` and ``<s>`` are never produced; the output stops at ``</s>``; an empty
line gives an empty line; the batches are attnkit's; finished hypotheses rank by ``log P / length^α``
(``decode.alpha``). What differs: CTranslate2 has no GNMT length penalty (``decode.length_penalty=gnmt``)
nor a choice of stopping rule; it bounds the output length per batch (``a · longest source + b``)
rather than per sentence, and cuts a hypothesis at the bound where attnkit's ends it with ``</s>``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from attnkit.config import DecodeConfig, with_decode_overrides
from attnkit.data.batching import length_batches
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.streams import stream_count
from attnkit.errors import AttnkitError
from attnkit.models.convert.export import DECODE_FILE


class CTranslate2Engine:
    """The CTranslate2 model, tokenizer and decoding settings of ``folder``, loaded once; ``translate``
    as often as needed (CPU, torch's thread count). ``overrides`` (``decode.field=value``) change the
    folder's decoding settings, as they change a checkpoint's for attnkit's own search; ``warn`` hears
    of one CTranslate2 cannot follow. ``decode.streams`` is CTranslate2's ``inter_threads``: batches
    translated at a time, each on its share of the threads, as attnkit's own (streams.py); fixed when
    the model loads, so an input of a single batch then runs on one stream's share."""

    def __init__(
        self, folder: Path, overrides: Sequence[str] = (), warn: Callable[[str], None] | None = None
    ) -> None:
        try:
            import ctranslate2
        except ImportError:
            raise AttnkitError(
                "--engine ctranslate2 needs CTranslate2: pip install 'attnkit[ctranslate2]'"
            ) from None
        if not (folder / DECODE_FILE).is_file() or not (folder / "model.bin").is_file():
            raise AttnkitError(f"{folder}: not a CTranslate2 folder from 'attnkit export --to ctranslate2'")
        self.tokenizer = Tokenizer.load(folder / "tokenizer.json")
        exported = DecodeConfig(**json.loads((folder / DECODE_FILE).read_text(encoding="utf-8")))
        self.decode = with_decode_overrides(exported, list(overrides))
        if self.decode.length_penalty != "length" and warn is not None:
            warn(f"CTranslate2 ranks hypotheses by log P / length^α; decode.length_penalty="
                 f"{self.decode.length_penalty} is attnkit's search only")  # fmt: skip
        threads = torch.get_num_threads()
        self.streams = stream_count(self.decode.streams, "cpu", threads)
        self.translator = ctranslate2.Translator(
            str(folder), device="cpu", inter_threads=self.streams, intra_threads=threads // self.streams
        )

    def translate(
        self, texts: list[str], beam_size: int | None = None, progress: Callable[[int], None] | None = None
    ) -> list[str]:
        """Translate ``texts``; ``beam_size`` 1 is greedy, default the run's ``decode.beam_size``. The
        batches are attnkit's (``decode.batch_size`` sentences of similar length), each with its own
        length bound, submitted at once so that ``decode.streams`` of them run at a time. ``progress``
        hears how many more lines are done, batch by batch."""
        tokenizer, decode = self.tokenizer, self.decode
        names, s = tokenizer.hf.id_to_token, tokenizer.specials
        sources = [[names(i) for i in ids] + [names(s.eos)] for ids in tokenizer.encode_batch(texts)]
        todo = [i for i, text in enumerate(texts) if text.strip()]
        pending = []
        for batch in length_batches(todo, [len(source) for source in sources], decode.batch_size):
            # attnkit's bound counts the </s> that ends an output, CTranslate2's does not
            words = int(decode.max_len_a * max(len(sources[i]) for i in batch) + decode.max_len_b) - 1
            if words < 1:
                continue  # room for </s> alone: empty outputs
            results = self.translator.translate_batch(
                [sources[i] for i in batch],
                asynchronous=True,
                beam_size=decode.beam_size if beam_size is None else beam_size,
                length_penalty=decode.alpha,
                max_decoding_length=words,
                min_decoding_length=0,  # an output may be empty, as in attnkit's search
                suppress_sequences=[[names(s.pad)], [names(s.bos)]],
            )
            pending.append((batch, results))
        outputs = [""] * len(texts)
        if progress is not None:
            progress(len(texts) - sum(len(batch) for batch, _ in pending))  # the lines left empty
        for batch, results in pending:
            for i, result in zip(batch, results, strict=True):
                tokens = result.result().hypotheses[0]
                outputs[i] = tokenizer.decode(tokenizer.hf.token_to_id(token) for token in tokens)
            if progress is not None:
                progress(len(batch))
        return outputs
