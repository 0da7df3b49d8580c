"""``attnkit translate --engine ctranslate2``: translating with CTranslate2 from a folder that
``attnkit export --to ctranslate2`` wrote, tokenised and detokenised by attnkit's own tokenizer.

What matches attnkit's search: the source is the tokens followed by ``</s>``; the decoder starts from
``<s>`` (set at export); ``<pad>`` and ``<s>`` are never produced; the output stops at ``</s>``; an empty
line gives an empty line. What differs: CTranslate2's beam search normalises scores by ``length^α``
rather than GNMT's ``((5 + length) / 6)^α``, and bounds the output length per batch
(``a · longest source + b``) rather than per sentence.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attnkit.config import DecodeConfig
from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.streams import stream_count
from attnkit.errors import AttnkitError
from attnkit.models.convert.export import DECODE_FILE


class CTranslate2Engine:
    """The CTranslate2 model, tokenizer and decoding settings of ``folder``, loaded once; ``translate``
    as often as needed (CPU, torch's thread count). ``streams``, default the folder's ``decode.streams``,
    is CTranslate2's ``inter_threads``: batches translated at a time, each on its share of the threads,
    as attnkit's own (streams.py); fixed when the model loads, so an input of a single batch then runs
    on one stream's share."""

    def __init__(self, folder: Path, streams: int | None = None) -> None:
        try:
            import ctranslate2
        except ImportError:
            raise AttnkitError(
                "--engine ctranslate2 needs CTranslate2: pip install 'attnkit[ctranslate2]'"
            ) from None
        if not (folder / DECODE_FILE).is_file() or not (folder / "model.bin").is_file():
            raise AttnkitError(f"{folder}: not a CTranslate2 folder from 'attnkit export --to ctranslate2'")
        self.tokenizer = Tokenizer.load(folder / "tokenizer.json")
        self.decode = DecodeConfig(**json.loads((folder / DECODE_FILE).read_text(encoding="utf-8")))
        threads = torch.get_num_threads()
        self.streams = stream_count(self.decode.streams if streams is None else streams, "cpu", threads)
        self.translator = ctranslate2.Translator(
            str(folder), device="cpu", inter_threads=self.streams, intra_threads=threads // self.streams
        )

    def translate(self, texts: list[str], beam_size: int | None = None) -> list[str]:
        """Translate ``texts``; ``beam_size`` 1 is greedy, default the run's ``decode.beam_size``."""
        tokenizer, decode = self.tokenizer, self.decode
        names, s = tokenizer.hf.id_to_token, tokenizer.specials
        todo = [i for i, text in enumerate(texts) if text.strip()]
        sources = [
            [names(i) for i in ids] + [names(s.eos)]
            for ids in tokenizer.encode_batch([texts[i] for i in todo])
        ]
        longest = max((len(source) for source in sources), default=0)
        results = self.translator.translate_batch(
            sources,
            beam_size=decode.beam_size if beam_size is None else beam_size,
            length_penalty=decode.alpha,
            max_batch_size=decode.batch_size,
            max_decoding_length=int(decode.max_len_a * longest + decode.max_len_b),
            suppress_sequences=[[names(s.pad)], [names(s.bos)]],
        )
        outputs = [""] * len(texts)
        for i, result in zip(todo, results, strict=True):
            outputs[i] = tokenizer.decode(tokenizer.hf.token_to_id(token) for token in result.hypotheses[0])
        return outputs
