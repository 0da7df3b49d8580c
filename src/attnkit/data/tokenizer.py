"""Tokenisers, all stored as one HF ``tokenizers`` JSON file (``tokenizer.json`` in a checkpoint).

- ``bpe``: byte-level byte-pair encoding (Sennrich et al., 2016; the byte-level variant of GPT-2), one
  vocabulary learned jointly over source and target as in the paper (§5.1: "shared source-target
  vocabulary of about 37000 tokens"). Its alphabet is the 256 byte values, so *any* UTF-8 text — accents,
  emoji, CJK, combining marks, even characters never seen in training — encodes without ``<unk>`` and
  decodes back exactly. A space is prepended before encoding (and one stripped after decoding) so that a
  sentence's first word is the same token as that word inside a sentence.
- ``char``: one token per character seen in training; a character never seen falls back to its UTF-8
  bytes (``<0xC3>``, ...), as SentencePiece's byte fallback does, so it round-trips too.
- ``word``: one token per whitespace-separated word (toy tasks); unseen words become ``<unk>`` and runs of
  spaces are not kept, so it is the one lossy kind.

Special tokens are found **by role** (pad, unk, bos, eos, and mask where there is one) in the
vocabulary, never assumed to sit at fixed ids: attnkit's own names, BERT's (``[PAD]``, ``[UNK]``,
``[CLS]``, ``[SEP]``, ``[MASK]``) and GPT-2's single ``<|endoftext|>`` are all recognised, so a real BERT
or GPT-2 ``tokenizer.json`` loads as it is. Everything downstream (batching, loss, search) takes its
ids from :attr:`Tokenizer.specials`. The text ``"</s>"`` inside a sentence is ordinary text, not the
end-of-sentence token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from attnkit.errors import DataError

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")  # attnkit's own vocabularies start with these, in this order
MASK = "<mask>"  # added after the learned vocabulary when a masked-LM task needs one
ROLE_TOKENS = {  # each role's token in attnkit's, BERT's and GPT-2's vocabularies, looked for in this order
    "pad": ("<pad>", "[PAD]", "<|endoftext|>"),
    "unk": ("<unk>", "[UNK]", "<|endoftext|>"),
    "bos": ("<s>", "[CLS]", "<|endoftext|>"),
    "eos": ("</s>", "[SEP]", "<|endoftext|>"),
    "mask": ("<mask>", "[MASK]"),  # optional: only masked-LM vocabularies have one
}
KINDS = ("bpe", "char", "word")
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))  # SentencePiece's names for byte fallback
MIN_BPE_VOCAB = len(SPECIALS) + 256  # the specials and the byte alphabet, before any merge


@dataclass(frozen=True)
class SpecialIds:
    """The ids of the tokens with a role: padding, unknown, begin (decoder start) and end of sentence."""

    pad: int
    unk: int
    bos: int  # also BERT's [CLS]
    eos: int  # also BERT's [SEP]
    mask: int | None = None


class Tokenizer:
    """Text to ids and back; :attr:`specials` holds the special ids, looked up by role."""

    def __init__(self, hf: HFTokenizer, source: str = "tokenizer") -> None:
        ids = {}
        for role, candidates in ROLE_TOKENS.items():
            ids[role] = next((i for t in candidates if (i := hf.token_to_id(t)) is not None), None)
            if ids[role] is None and role != "mask":
                names = " or ".join(candidates)
                raise DataError(f"{source}: the vocabulary has no {names} token (needed as the {role} token)")
        self.specials = SpecialIds(**ids)
        self.special_set = frozenset(i for i in ids.values() if i is not None)  # every special id
        hf.encode_special_tokens = True  # "</s>" typed in a sentence is text (not stored in tokenizer.json)
        hf.no_padding()  # a tokenizer.json may pad or truncate by itself (BERT's often do); attnkit batches
        hf.no_truncation()  # and bounds lengths itself, and a text's ids are all of its tokens
        self.hf = hf

    @classmethod
    def train(
        cls,
        kind: str,
        texts: Iterable[str],
        vocab_size: int = 8000,
        min_frequency: int = 2,
        mask: bool = False,
    ) -> Tokenizer:
        """Learn a ``kind`` tokeniser (``bpe``, ``char`` or ``word``) from ``texts``; with ``mask``, a
        ``<mask>`` token is added after the learned vocabulary (masked-LM pre-training needs one)."""
        if kind == "bpe":
            hf = _train_byte_level_bpe(texts, vocab_size, min_frequency)
        elif kind == "char":
            hf = _char_tokenizer(texts)
        elif kind == "word":
            hf = HFTokenizer(models.WordLevel(unk_token="<unk>"))
            hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
            trainer = trainers.WordLevelTrainer(
                vocab_size=vocab_size, special_tokens=list(SPECIALS), min_frequency=1, show_progress=False
            )
            hf.train_from_iterator(texts, trainer=trainer)
        else:
            raise DataError(f"data.tokenizer must be one of {KINDS}, got {kind!r}")
        if mask:
            hf.add_special_tokens([MASK])
        return cls(hf)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        if not Path(path).is_file():
            raise DataError(f"{path}: file not found")
        # read here, not by tokenizers: it takes no file name that the C locale escaped (utf8.py)
        return cls.from_str(Path(path).read_text(encoding="utf-8"), str(path))

    @classmethod
    def from_str(cls, text: str, source: str = "tokenizer") -> Tokenizer:
        """The tokenizer a :meth:`to_str` (or a ``tokenizer.json`` file) holds; ``source``: what errors
        call it."""
        try:
            hf = HFTokenizer.from_str(text)
        except Exception as error:  # tokenizers raises plain Exception subclasses with long messages
            raise DataError(f"{source}: not a tokenizer file ({str(error).splitlines()[0]})") from None
        return cls(hf, source)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.hf.to_str(pretty=True), encoding="utf-8")

    def to_str(self) -> str:
        return self.hf.to_str()

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and, for each, the ``(start, end)`` characters of ``text`` it covers (which may include
        the space before a word): how a span of tokens is mapped back to a span of text."""
        encoding = self.hf.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    def decode(self, ids: Iterable[int]) -> str:
        """Text for ``ids``, stopping at the end-of-sentence token and leaving out the other specials."""
        kept = []
        for i in ids:
            i = int(i)
            if i == self.specials.eos:
                break
            if i not in self.special_set:
                kept.append(i)
        return self.hf.decode(kept, skip_special_tokens=False)

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """Readable token strings of ``ids`` for plots: bytes shown as text, a leading space as "▁"."""
        shown = []
        for i in ids:
            token = self.hf.id_to_token(int(i))
            if isinstance(self.hf.pre_tokenizer, pre_tokenizers.ByteLevel) and int(i) not in self.special_set:
                token = _BYTE_LEVEL.decode([token])
            shown.append(token.replace(" ", "▁"))
        return shown


_BYTE_LEVEL = decoders.ByteLevel()


def _train_byte_level_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int) -> HFTokenizer:
    if vocab_size < MIN_BPE_VOCAB:
        raise DataError(
            f"data.vocab_size={vocab_size} is too small for byte-level BPE: it needs at least "
            f"{MIN_BPE_VOCAB} ({len(SPECIALS)} special tokens + 256 bytes) plus room for merges"
        )
    hf = HFTokenizer(models.BPE(unk_token="<unk>"))
    hf.normalizer = normalizers.Prepend(" ")  # "Hund" starts a sentence as it does inside one
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer=trainer)
    return hf


def _char_tokenizer(texts: Iterable[str]) -> HFTokenizer:
    """Characters by frequency, with the 256 byte tokens for anything else (a BPE model without merges)."""
    counts = Counter(char for text in texts for char in text)
    chars = [c for c, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    vocab = {token: i for i, token in enumerate([*SPECIALS, *BYTE_TOKENS, *chars])}
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    hf.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    hf.add_special_tokens(list(SPECIALS))
    return hf
