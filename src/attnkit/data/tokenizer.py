"""Tokenisers, all stored as one HF ``tokenizers`` JSON file (``tokenizer.json`` in a run directory).

- ``bpe``: byte-pair encoding (Sennrich et al., 2016), one vocabulary learned jointly over source and
  target as in the paper (§5.1: "shared source-target vocabulary of about 37000 tokens"). Spaces are
  kept as the "▁" marker, so decoding gives back the original text.
- ``char``: one token per character (synthetic tasks, character-level models).
- ``word``: one token per whitespace-separated word (toy tasks).

Every vocabulary starts with the same four specials, so their ids are fixed.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from attnkit.errors import DataError

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(4)
KINDS = ("bpe", "char", "word")


class Tokenizer:
    """Text to ids and back, with fixed special ids: ``<pad>``=0, ``<unk>``=1, ``<s>``=2, ``</s>``=3."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, hf: HFTokenizer) -> None:
        for expected_id, token in enumerate(SPECIALS):
            if hf.token_to_id(token) != expected_id:
                raise DataError(f"tokenizer: special token {token} must have id {expected_id}")
        self.hf = hf

    @classmethod
    def train(
        cls, kind: str, texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2
    ) -> Tokenizer:
        """Learn a ``kind`` tokeniser (``bpe``, ``char`` or ``word``) from ``texts``."""
        if kind == "bpe":
            hf = HFTokenizer(models.BPE(unk_token="<unk>"))
            hf.pre_tokenizer = pre_tokenizers.Metaspace()
            hf.decoder = decoders.Metaspace()
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size,
                min_frequency=min_frequency,
                special_tokens=list(SPECIALS),
                show_progress=False,
            )
        elif kind in ("char", "word"):
            hf = HFTokenizer(models.WordLevel(unk_token="<unk>"))
            if kind == "char":
                hf.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
                hf.decoder = decoders.Fuse()
            else:
                hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
            trainer = trainers.WordLevelTrainer(
                special_tokens=list(SPECIALS), min_frequency=1, show_progress=False
            )
        else:
            raise DataError(f"data.tokenizer must be one of {KINDS}, got {kind!r}")
        hf.train_from_iterator(texts, trainer=trainer)
        return cls(hf)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        try:
            return cls(HFTokenizer.from_file(str(path)))
        except Exception as error:  # tokenizers raises plain Exception subclasses with long messages
            raise DataError(f"{path}: not a tokenizer file ({str(error).splitlines()[0]})") from None

    def save(self, path: str | Path) -> None:
        self.hf.save(str(path))

    def to_str(self) -> str:
        return self.hf.to_str()

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text for ``ids``, stopping at ``</s>`` and leaving out the other specials."""
        kept = []
        for i in ids:
            if i == EOS_ID:
                break
            if i > EOS_ID:
                kept.append(int(i))
        return self.hf.decode(kept)

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """The token strings of ``ids`` (for attention plots)."""
        return [self.hf.id_to_token(int(i)) for i in ids]
