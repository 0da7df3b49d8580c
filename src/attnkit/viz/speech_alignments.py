"""Listen, Attend and Spell's figure (Chan et al., 2016, Fig. 2; Chorowski et al., 2015, Fig. 1): an
utterance's log-mel spectrogram, and beneath it, on the same time axis, the speller's attention at
each character it wrote: a line from the top left to the bottom right where the alignment is
monotone, as speech is.

Each annotation stands for ``reduction`` frames (models/listen_attend_spell.py), so its weight is drawn
over those frames.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnkit.data.tokenizer import Tokenizer
from attnkit.decode.transcripts import alignments_while_spelling


@torch.no_grad()
def plot_speech_alignments(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    features: list[Tensor],
    transcripts: list[str],
    path: str | Path,
    device: torch.device | str = "cpu",
) -> Path:
    """Save a PNG with, for each utterance of ``features`` (each ``(frames, n_mels)``), its spectrogram
    over the alignment of ``transcripts`` (what the model heard in it) to its frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids, weights = alignments_while_spelling(model, tokenizer, features, transcripts, device)  # (N, T, S)
    reduction = model.config.reduction
    figure, panels = plt.subplots(2 * len(ids), 1, figsize=(10, 5 * len(ids)), squeeze=False,
                                  gridspec_kw={"height_ratios": [1, 2.6] * len(ids)})  # fmt: skip
    for row, (frames, written) in enumerate(zip(features, ids, strict=True)):
        top, bottom = panels[2 * row, 0], panels[2 * row + 1, 0]
        top.imshow(frames.T.float().numpy(), origin="lower", aspect="auto", cmap="magma")
        top.set_ylabel("mel band")
        top.set_title(f"“{transcripts[row]}”", fontsize=9)
        spread = weights[row, : len(written)].repeat_interleave(reduction, -1)[
            :, : len(frames)
        ]  # (T, frames)
        bottom.imshow(spread.numpy(), aspect="auto", cmap="Greys", interpolation="nearest")
        letters = ["␣" if c == " " else c for c in tokenizer.tokens(written)]
        bottom.set_yticks(range(len(written)), letters, fontsize=5)
        bottom.set_xlabel("frame (10 ms)")
        bottom.set_xlim(top.get_xlim())
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)
