"""Images and captioners for the tests of what reads them (data/images.py, the captioner's server, the
soak): decompression bombs, PNGs whose header declares a huge image whose pixels compress to almost
nothing; an untrained captioner saved as a run."""

import struct
import zlib
from pathlib import Path


def bomb(side: int, depth: int = 8) -> bytes:
    """A PNG whose header declares a ``side × side`` grey image of zeros, compressed to almost nothing
    (8000: 62 KB for about 700 MB of pixels as floats)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"\0" * ((side * depth + 7) // 8 + 1) * side
    header = struct.pack(">IIBBBBB", side, side, depth, 0, 0, 0, 0)
    png = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + png


def untrained_captioner(folder: Path) -> Path:
    """A small Transformer captioner with random weights (its captions need only be its own), writing at
    most 8 tokens, saved as a run in ``folder``."""
    import torch

    from attnkit.checkpoint.folder import CheckpointContents, save_checkpoint
    from attnkit.config import RunConfig
    from attnkit.models import build_model, from_preset
    from attnkit.tasks.captioning import caption_tokenizer

    tokenizer = caption_tokenizer()
    torch.manual_seed(1)
    config = from_preset("caption-transformer-tiny", max_len=8)
    model = build_model(config, tokenizer.vocab_size)
    contents = CheckpointContents(model, RunConfig.for_model(config).to_dict(), tokenizer.to_str())
    save_checkpoint(folder, 1, contents, is_best=True)
    return folder
