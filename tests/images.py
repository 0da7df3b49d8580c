"""Image files for the tests of what reads them (data/images.py, the captioner's server): decompression
bombs, PNGs whose header declares a huge image whose pixels compress to almost nothing."""

import struct
import zlib


def bomb(side: int, depth: int = 8) -> bytes:
    """A PNG whose header declares a ``side × side`` grey image of zeros, compressed to almost nothing
    (8000: 62 KB for about 700 MB of pixels as floats)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"\0" * ((side * depth + 7) // 8 + 1) * side
    header = struct.pack(">IIBBBBB", side, side, depth, 0, 0, 0, 0)
    png = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + png
