"""A tiny raster canvas that writes PNG files, in pure Python (``zlib`` and ``struct``), for the benchmark chart
when matplotlib is not installed. Rectangles and text in a built-in 5x8 bitmap font; nothing else."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

Color = tuple[int, int, int]

# The printable ASCII characters, " " to "~", 8 symbols each: one per pixel row, top to bottom, a base-32 digit
# whose 5 bits are the row's pixels, left to right. Rows 0-6 hold capitals and digits; row 7 the descenders.
_FONT_DATA = (
    "0000000044444040aa000000aavavaa04fke5u40op248j30cik8lid044000000248884208422248004lel400044v4400"  #  !"#$%&'()*+
    "00000448000v000000000cc001248g00ehjlphe04c4444e0eh1248v0v2421he026aiv220vgu11he068guhhe0v1248880"  # ,-./01234567
    "ehhehhe0ehhf12c00cc0cc000cc0cc80248g842000v0v00084212480eh124040eh1dlle0ehhvhhh0uhhuhhu0ehggghe0"  # 89:;<=>?@ABC
    "sihhhis0vgguggv0vgguggg0ehgnhhf0hhhvhhh0e44444e072222ic0hikokih0ggggggv0hrllhhh0hhpljhh0ehhhhhe0"  # DEFGHIJKLMNO
    "uhhuggg0ehhhlid0uhhukih0fgge11u0v4444440hhhhhhe0hhhhha40hhhllla0hha4ahh0hha44440v1248gv0e88888e0"  # PQRSTUVWXYZ[
    "0g842100e22222e04ah00000000000v08400000000e1fhf0ggmphhu000egghe011djhhf000ehvge0698s888000fhhf1e"  # \]^_`abcdefg
    "ggmphhh040c444e0206222icggikoki0c44444e000qllhh000mphhh000ehhhe000uhhugg00fhhf1100mpggg000fge1u0"  # hijklmnopqrs
    "88s8896000hhhjd000hhha4000hhlla000ha4ah000hhhf1e00v248v0244844204444444084424480008l2000"  # tuvwxyz{|}~
)
GLYPH_WIDTH, GLYPH_HEIGHT, ADVANCE = 5, 8, 6  # pixels at scale 1; ADVANCE includes one column of spacing


def _glyph_rows(char: str) -> list[int]:
    index = ord(char) - 32
    if not 0 <= index < len(_FONT_DATA) // GLYPH_HEIGHT:
        index = ord("?") - 32
    return [int(digit, 32) for digit in _FONT_DATA[index * GLYPH_HEIGHT : (index + 1) * GLYPH_HEIGHT]]


def text_width(text: str, scale: int = 1) -> int:
    """Width in pixels of ``text`` drawn at ``scale``."""
    return len(text) * ADVANCE * scale


class Canvas:
    """An RGB image, white unless told otherwise; coordinates in pixels from the top left corner."""

    def __init__(self, width: int, height: int, background: Color = (255, 255, 255)) -> None:
        self.width, self.height = width, height
        self._pixels = bytearray(bytes(background) * (width * height))

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill the rectangle from (x0, y0) included to (x1, y1) excluded, clipped to the canvas."""
        x0, x1 = max(0, min(x0, x1)), min(self.width, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.height, max(y0, y1))
        if x0 >= x1:
            return
        span = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            start = 3 * (y * self.width + x0)
            self._pixels[start : start + len(span)] = span

    def text(self, x: int, y: int, text: str, color: Color = (0, 0, 0), scale: int = 1) -> int:
        """Draw ``text`` with its top left corner at (x, y); return the x just after it."""
        for char in text:
            for row, bits in enumerate(_glyph_rows(char)):
                for col in range(GLYPH_WIDTH):
                    if bits & (1 << (GLYPH_WIDTH - 1 - col)):
                        px, py = x + col * scale, y + row * scale
                        self.rect(px, py, px + scale, py + scale, color)
            x += ADVANCE * scale
        return x

    def png(self) -> bytes:
        """The image as a PNG file: 8-bit RGB, no interlacing, every row with filter type 0 (none)."""

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        stride = 3 * self.width
        raw = b"".join(b"\x00" + bytes(self._pixels[y * stride : (y + 1) * stride]) for y in range(self.height))
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.png())
