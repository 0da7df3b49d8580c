"""Masked-language-model pre-training (BERT §3.1, task 1): hide some tokens, predict them from both sides.

Data are sentences (``data.task: mlm``): text files with one sentence per line, or TSV files of
``sentence<TAB>label`` whose labels are ignored (so a classifier's own training sentences can pre-train
it), prepared once into a token store (``tasks/classification.py`` :func:`prepared_sentences`). Without
``data.valid``, the last ``data.valid_fraction`` of the training sentences is held out (kept in the store
after the training rows; the tokenizer does not learn from it). Each sentence becomes
``[CLS] sentence [SEP]`` (cut to ``model.max_len``).

BERT's recipe: 15% of the real tokens of a batch are chosen for prediction (at least one per batch); of
those, 80% are replaced by ``[MASK]``, 10% by a random token and 10% left as they are, so that the model
cannot learn that only ``[MASK]`` positions matter. The loss is the cross-entropy at the chosen
positions only. The choice is drawn from ``(train.seed, epoch, batch)``, so a resumed run masks exactly
as the uninterrupted one; validation masks with fixed seeds, so its scores compare across steps.
Validation reports the loss and perplexity of the chosen tokens and the masked-token accuracy.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from attnkit.config import RunConfig
from attnkit.data.batching import EncoderBatch, encoder_input, length_batches, pad, token_batches
from attnkit.data.readers import iter_sentences
from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import AttnkitError, DataError
from attnkit.models import evaluating
from attnkit.tasks.classification import ScoredAsAClassifier, cut_row, encode_sentences, prepared_sentences
from attnkit.tasks.losses import label_smoothed_loss
from attnkit.tasks.validation import validation_loss

MASK_RATE, REPLACE_WITH_MASK, REPLACE_WITH_RANDOM = 0.15, 0.8, 0.1  # BERT's 15%, and its 80/10/10


def mask_tokens(
    ids: Tensor, maskable: Tensor, mask_id: int, random_ids: Tensor, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """BERT's masking of ``ids (B, T)`` where ``maskable``: returns the corrupted inputs and the chosen
    positions ``(B, T)`` (bool). Random replacements are drawn from ``random_ids`` (no special tokens)."""
    chosen = (torch.rand(ids.shape, generator=generator) < MASK_RATE) & maskable
    if not chosen.any():  # a batch of very short sentences: predict one token rather than none
        candidates = maskable.nonzero()
        pick = candidates[torch.randint(len(candidates), (1,), generator=generator)]
        chosen[pick[0, 0], pick[0, 1]] = True
    roll = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[chosen & (roll < REPLACE_WITH_MASK)] = mask_id
    swap = chosen & (roll >= REPLACE_WITH_MASK) & (roll < REPLACE_WITH_MASK + REPLACE_WITH_RANDOM)
    inputs[swap] = random_ids[torch.randint(len(random_ids), (int(swap.sum()),), generator=generator)]
    return inputs, chosen  # the remaining 10% of the chosen keep their token


class MaskedLMTask(ScoredAsAClassifier):
    """The trainer's view of masked-LM pre-training (see the module docstring)."""

    unit: ClassVar[str] = "masked tokens"  # what the loss is summed over (the speed shown is masked tokens/s)

    def __init__(self, config: RunConfig, tokenizer: Tokenizer | None, echo: Callable[[str], None]) -> None:
        d, t = config.data, config.train
        self.label_smoothing, self.max_tokens, self.seed = t.label_smoothing, t.max_tokens, t.seed
        if tokenizer is not None and tokenizer.specials.mask is None:  # before a store is built with it
            raise DataError("the tokenizer has no <mask> or [MASK] token, which masked-LM training needs")
        store = prepared_sentences(config, tokenizer, echo, labelled=False)
        self.tokenizer = tokenizer = store.tokenizer
        self.random_ids = torch.tensor(
            [i for i in range(tokenizer.vocab_size) if i not in tokenizer.special_set]
        )
        sentences, n_train = store.columns["sentence"], store.report["train_rows"]
        self.rows, cut_train = sentences.part(0, n_train), store.report["cut"][0]
        if d.valid:  # small: read whole
            valid = [sentence for sentence, _ in iter_sentences(d.path(d.valid[0]))]
            self.valid_rows, cut_valid = encode_sentences(tokenizer, valid, config.model.max_len)
        else:  # the training file's last data.valid_fraction, held out in the store
            self.valid_rows, cut_valid = sentences.part(n_train, len(sentences)), store.report["cut"][1]
        if cut_train or cut_valid:
            echo(f"cut {cut_train} training and {cut_valid} validation sentences to model.max_len tokens")
        echo(
            f"training sentences: {len(self.rows):,}; validation: {len(self.valid_rows):,}; "
            f"vocabulary: {tokenizer.vocab_size:,}"
        )

    def epoch_batches(self, epoch: int) -> list[tuple[np.ndarray, int]]:
        """This epoch's batches: sentence indices and the seed that masks them."""
        lengths = self.rows.lengths()
        groups = token_batches(lengths, lengths, self.max_tokens, seed=self.seed, epoch=epoch)
        seeds = random.Random(self.seed * 1_000_003 + epoch)
        return [(group, seeds.randrange(2**62)) for group in groups]

    def make_batch(self, description: tuple[Sequence[int], int]) -> EncoderBatch:
        indices, seed = description
        return self._masked([self.rows[i] for i in indices], seed)

    def _masked(self, rows: list[list[int]], seed: int) -> EncoderBatch:
        specials = self.tokenizer.specials
        ids = pad(rows, specials.pad)
        maskable = (ids != specials.pad) & (ids != specials.bos) & (ids != specials.eos)
        generator = torch.Generator().manual_seed(seed)
        inputs, chosen = mask_tokens(ids, maskable, specials.mask, self.random_ids, generator)
        return EncoderBatch(inputs, torch.zeros_like(ids), (chosen, ids[chosen]), int(chosen.sum()))

    def loss(self, model: torch.nn.Module, batch: EncoderBatch) -> tuple[Tensor, Tensor]:
        """Summed (label-smoothed) loss and NLL of the chosen tokens."""
        return self._loss(model(batch.ids, batch.token_types, select=batch.targets[0]), batch)

    def _loss(self, logits: Tensor, batch: EncoderBatch) -> tuple[Tensor, Tensor]:
        """``logits (n chosen, V)`` against the chosen tokens."""
        return label_smoothed_loss(
            logits, batch.targets[1], self.label_smoothing, self.tokenizer.specials.pad
        )

    def validate(self, model: torch.nn.Module, device: torch.device, autocast: Callable) -> dict[str, float]:
        """Loss, perplexity and accuracy of the masked tokens, masked the same way at every validation."""
        lengths = [len(row) for row in self.valid_rows]
        groups = token_batches(lengths, lengths, self.max_tokens, seed=0, epoch=0, shuffle=False)
        batches = [self._masked([self.valid_rows[i] for i in g], seed) for seed, g in enumerate(groups)]
        correct = []  # each batch's correctly predicted tokens, from the same forward pass as its loss

        def loss_and_hits(model: torch.nn.Module, batch: EncoderBatch) -> tuple[Tensor, Tensor]:
            logits = model(batch.ids, batch.token_types, select=batch.targets[0])
            correct.append((logits.argmax(-1) == batch.targets[1]).sum())
            return self._loss(logits, batch)

        scores = validation_loss(loss_and_hits, model, batches, device, autocast)
        hits = int(torch.stack(correct).sum()) if correct else 0
        return {**scores, "valid_accuracy": hits / sum(b.n_tokens for b in batches)}

    @classmethod
    def prepare_store(cls, config: RunConfig, echo: Callable[[str], None]) -> None:
        """``attnkit prepare``: the training sentences in a token store (:func:`prepared_sentences`)."""
        prepared_sentences(config, None, echo, labelled=False)

    @classmethod
    def infer(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        config: RunConfig,
        inputs: Sequence[str],
        device: torch.device | str,
        where: str = "input",
        first: int = 1,
    ) -> list[str]:
        """The most probable token at each mask of each sentence, and its probability:
        ``token<TAB>probability`` per mask (BERT's fill-the-blank), written as the tokenizer writes its
        mask token (``[MASK]`` or ``<mask>``)."""
        mask = tokenizer.specials.mask
        if mask is None:
            raise AttnkitError("this model's tokenizer has no mask token to fill")
        written, longest = tokenizer.hf.id_to_token(mask), config.model.max_len  # "[MASK]", "<mask>"
        rows = []
        for number, line in enumerate(inputs, start=first):
            if written not in line:
                raise AttnkitError(f"{where}:{number}: no {written} to fill")
            row = _with_masks(tokenizer, line, written, mask)
            row = cut_row(row, longest)  # as in training
            if mask not in row:
                raise AttnkitError(f"{where}:{number}: its {written} is beyond the model's {longest} tokens")
            rows.append(row)
        filled = [""] * len(rows)
        with evaluating(model), torch.no_grad():
            for group in length_batches(range(len(rows)), [len(r) for r in rows], config.decode.batch_size):
                ids = pad([rows[i] for i in group], tokenizer.specials.pad).to(device)  # (B, T)
                chosen = ids == mask
                best, token = model(ids, select=chosen).float().softmax(-1).max(-1)  # (masks in the batch,)
                pairs = zip(best.tolist(), token.tolist(), strict=True)
                found = (f"{_written(tokenizer, t)}\t{p:.4f}" for p, t in pairs)
                for i, n in zip(group, chosen.sum(-1).tolist(), strict=True):  # row by row, in order
                    filled[i] = "\t".join(itertools.islice(found, n))
        return filled


def _with_masks(tokenizer: Tokenizer, line: str, written: str, mask: int) -> list[int]:
    """``[CLS] line [SEP]`` ids with the mask id wherever ``line`` has ``written``: the text between
    masks is encoded piece by piece (a tokenizer need not read its mask token in text), each piece
    before a mask without its trailing spaces, each after one with its leading space (a byte-level
    BPE's word starts)."""
    pieces = line.split(written)
    ids: list[int] = []
    for k, piece in enumerate(pieces):
        if k:
            ids.append(mask)
        text = piece if k == len(pieces) - 1 else piece.rstrip()
        ids += tokenizer.encode(text) if text.strip() else []
    return encoder_input(ids, tokenizer.specials)[0]


def _written(tokenizer: Tokenizer, token: int) -> str:
    """A predicted token as text (``paris``; a special token as the vocabulary writes it, ``<unk>``)."""
    return tokenizer.decode([token]).strip() or tokenizer.hf.id_to_token(token)
