"""Generated pictures and their PNG, JPEG and WebP files, with the standard library only.

A :class:`Picture` is a mosaic: a grid of flat tiles, each channel of each tile one of two
levels of a palette, all derived from a seed (``shake_256``): the same seed and size give the
same bytes. A partial image (streamed image generation) is the same mosaic at a coarser
grid, each coarse tile the colour of its first fine tile, so the partials sharpen into the
final image.

The encoders are generators (run them with :func:`llmsim.api.validate.paced`: a 1536×1024
picture never holds the event loop for more than a slice) that yield work units and return
the file's bytes:

- PNG: 8-bit RGB, filter 0, zlib (:func:`png`);
- JPEG: baseline, 4:4:4, a flat quantiser and one DC and one AC Huffman table of fixed code
  lengths (valid canonical codes, not the Annex K tables); a block inside one tile is its DC
  term alone, any other block goes through the DCT (:func:`jpeg`);
- WebP: lossless VP8L without transforms: each channel has two levels, so each is a
  two-symbol "simple" prefix code of one bit a pixel (:func:`webp`).

A transparent background (``alpha``, PNG and WebP) makes the tiles whose level bits are all
0 clear (alpha 0), the others opaque.
"""

from __future__ import annotations

import hashlib
import math
import struct
import zlib
from collections.abc import Generator
from dataclasses import dataclass

__all__ = ["Picture", "picture", "png", "jpeg", "webp", "encode", "FORMATS"]

FORMATS = ("png", "jpeg", "webp")
Encoded = Generator[int, None, bytes]


@dataclass(frozen=True, slots=True)
class Picture:
    width: int
    height: int
    xs: tuple[int, ...]  # column boundaries, 0 .. width
    ys: tuple[int, ...]  # row boundaries, 0 .. height
    colors: tuple[tuple[tuple[int, int, int], ...], ...]  # [row][col] RGB
    bits: tuple[tuple[int, ...], ...]  # [row][col] level bits: green 1, red 2, blue 4
    levels: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]  # (lo, hi) of R, G, B
    alpha: bool = False  # a transparent background: the tiles whose bits are 0 are clear


def _bounds(size: int, tile: int) -> tuple[int, ...]:
    return tuple(range(0, size, tile)) + (size,)


def _levels(a: int, b: int) -> tuple[int, int]:
    lo, hi = min(a, b), max(a, b)
    if lo == hi:  # two distinct levels (the WebP codes need two symbols)
        return (lo - 97, hi) if lo >= 128 else (lo, hi + 97)
    return lo, hi


def picture(seed: bytes, width: int, height: int, coarser: int = 0,
            alpha: bool = False) -> Picture:
    """The mosaic of ``seed`` at ``width``×``height``; ``coarser`` > 0: a partial image with
    tiles 2**coarser times larger; ``alpha``: with a transparent background (PNG, WebP)."""
    tile = 16 * max(1, min(width, height) // 512)
    cols, rows = -(-width // tile), -(-height // tile)
    stream = hashlib.shake_256(seed + struct.pack("<II", width, height)).digest(6 + cols * rows)
    lv = (_levels(stream[0], stream[1]), _levels(stream[2], stream[3]),
          _levels(stream[4], stream[5]))
    step = 1 << coarser
    big = tile * step
    xs, ys = _bounds(width, big), _bounds(height, big)
    bits = tuple(tuple(stream[6 + (r * step) * cols + c * step] & 7
                       for c in range(len(xs) - 1)) for r in range(len(ys) - 1))
    colors = tuple(tuple((lv[0][(b >> 1) & 1], lv[1][b & 1], lv[2][(b >> 2) & 1]) for b in row)
                   for row in bits)
    return Picture(width, height, xs, ys, colors, bits, lv, alpha)


def encode(p: Picture, fmt: str) -> Encoded:
    return {"png": png, "jpeg": jpeg, "webp": webp}[fmt](p)


# -- PNG -------------------------------------------------------------------------------------

def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(p: Picture) -> Encoded:
    comp = zlib.compressobj(6)
    out = []
    for r in range(len(p.ys) - 1):
        line = b"\x00" + b"".join(
            (bytes(p.colors[r][c]) + (b"\xff" if p.bits[r][c] else b"\x00") if p.alpha
             else bytes(p.colors[r][c])) * (p.xs[c + 1] - p.xs[c]) for c in range(len(p.xs) - 1))
        h = p.ys[r + 1] - p.ys[r]
        out.append(comp.compress(line * h))
        yield len(line) * h
    out.append(comp.flush())
    ihdr = struct.pack(">IIBBBBB", p.width, p.height, 8, 6 if p.alpha else 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", b"".join(out))
            + _chunk(b"IEND", b""))


# -- JPEG ------------------------------------------------------------------------------------

QUANT = 8  # flat quantiser: a flat block's DC term is exact
_ZIGZAG: list[int] = []
for _s in range(15):
    _cells = [(i, _s - i) for i in range(max(0, _s - 7), min(_s, 7) + 1)]
    if _s % 2 == 0:
        _cells.reverse()
    _ZIGZAG += [r * 8 + c for r, c in _cells]
_DCT = [[(math.sqrt(0.5) if u == 0 else 1.0) / 2 * math.cos((2 * x + 1) * u * math.pi / 16)
         for x in range(8)] for u in range(8)]
# canonical Huffman codes of fixed length: DC categories 0..11 in 4 bits, AC symbols in 8 bits
_AC_SYMBOLS = [0x00, 0xF0] + [(r << 4) | s for r in range(16) for s in range(1, 11)]
_AC_CODE = {sym: i for i, sym in enumerate(_AC_SYMBOLS)}


def _ycc(rgb: tuple[int, int, int]) -> tuple[float, float, float]:
    r, g, b = rgb
    return (0.299 * r + 0.587 * g + 0.114 * b - 128,
            -0.168736 * r - 0.331264 * g + 0.5 * b,
            0.5 * r - 0.418688 * g - 0.081312 * b)


def _magnitude(v: int) -> tuple[int, int]:
    """(category, bits) of a coefficient as JPEG codes it."""
    s = abs(v).bit_length()
    return s, (v if v >= 0 else v + (1 << s) - 1)


def _dct(block: list[float], quant: int) -> list[int]:
    tmp = [[sum(_DCT[v][x] * block[y * 8 + x] for x in range(8)) for v in range(8)]
           for y in range(8)]
    coef = [0] * 64
    for u in range(8):
        du = _DCT[u]
        for v in range(8):
            coef[u * 8 + v] = round(sum(du[y] * tmp[y][v] for y in range(8)) / quant)
    return [coef[i] for i in _ZIGZAG]


def jpeg(p: Picture, quant: int = QUANT) -> Encoded:
    """``quant``: the flat quantiser (2: near lossless; at least 2 keeps every AC term in the
    Huffman table's ten magnitude bits)."""
    w, h = p.width, p.height
    col_of = [0] * w
    for c in range(len(p.xs) - 1):
        for x in range(p.xs[c], p.xs[c + 1]):
            col_of[x] = c
    row_of = [0] * h
    for r in range(len(p.ys) - 1):
        for y in range(p.ys[r], p.ys[r + 1]):
            row_of[y] = r
    ycc = [[_ycc(c) for c in row] for row in p.colors]
    qdc = [[tuple(round(v * 8 / quant) for v in c) for c in row] for row in ycc]
    out = bytearray()
    acc = nbits = 0
    pred = [0, 0, 0]
    for by in range(0, h, 8):
        y1 = min(by + 7, h - 1)
        for bx in range(0, w, 8):
            x1 = min(bx + 7, w - 1)
            r0, c0 = row_of[by], col_of[bx]
            if r0 == row_of[y1] and c0 == col_of[x1]:  # inside one tile: DC, then EOB
                q = qdc[r0][c0]
                for comp in range(3):
                    d = q[comp] - pred[comp]
                    s, b = _magnitude(d) if d else (0, 0)
                    acc = (acc << (12 + s)) | (((s << s) | b) << 8)  # EOB is code 0
                    nbits += 12 + s
                pred = list(q)
                continue
            for comp in range(3):
                zz = _dct([ycc[row_of[min(by + i // 8, h - 1)]]
                           [col_of[min(bx + i % 8, w - 1)]][comp] for i in range(64)], quant)
                s, b = _magnitude(zz[0] - pred[comp])
                pred[comp] = zz[0]
                acc = (acc << (4 + s)) | (s << s) | b
                nbits += 4 + s
                run = 0
                last = max((i for i in range(1, 64) if zz[i]), default=0)
                for i in range(1, last + 1):
                    v = zz[i]
                    if not v:
                        run += 1
                        continue
                    while run > 15:
                        acc = (acc << 8) | _AC_CODE[0xF0]
                        nbits += 8
                        run -= 16
                    s, b = _magnitude(v)
                    acc = (acc << (8 + s)) | (_AC_CODE[(run << 4) | s] << s) | b
                    nbits += 8 + s
                    run = 0
                if last < 63:
                    acc = (acc << 8) | _AC_CODE[0x00]
                    nbits += 8
        if nbits >= 8:
            k = nbits // 8
            rest = nbits - 8 * k
            out += (acc >> rest).to_bytes(k, "big").replace(b"\xff", b"\xff\x00")
            acc &= (1 << rest) - 1
            nbits = rest
        yield w * 8
    if nbits:
        pad = 8 - nbits
        out += (((acc << pad) | ((1 << pad) - 1)) & 0xFF).to_bytes(1, "big").replace(
            b"\xff", b"\xff\x00")

    def seg(marker: int, data: bytes) -> bytes:
        return struct.pack(">HH", marker, len(data) + 2) + data

    dht = (b"\x00" + bytes([0, 0, 0, 12] + [0] * 12) + bytes(range(12))
           + b"\x10" + bytes([0] * 7 + [len(_AC_SYMBOLS)] + [0] * 8) + bytes(_AC_SYMBOLS))
    return (b"\xff\xd8"
            + seg(0xFFE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
            + seg(0xFFDB, b"\x00" + bytes([quant] * 64))
            + seg(0xFFC0, struct.pack(">BHHB", 8, h, w, 3) + b"\x01\x11\x00\x02\x11\x00\x03\x11\x00")
            + seg(0xFFC4, dht)
            + seg(0xFFDA, b"\x03\x01\x00\x02\x00\x03\x00\x00\x3f\x00")
            + bytes(out) + b"\xff\xd9")


# -- WebP (lossless VP8L) --------------------------------------------------------------------

def webp(p: Picture) -> Encoded:
    out = bytearray()
    acc = nbits = 0

    def put(value: int, n: int) -> None:
        nonlocal acc, nbits
        acc |= value << nbits
        nbits += n

    put(0x2F, 8)
    put(p.width - 1, 14)
    put(p.height - 1, 14)
    put(int(p.alpha), 1)  # alpha used
    put(0, 3)  # version
    put(0, 1)  # no transform
    put(0, 1)  # no colour cache
    put(0, 1)  # no meta prefix codes
    (rl, rh), (gl, gh), (bl, bh) = p.levels
    for lo, hi in ((gl, gh), (rl, rh), (bl, bh)):  # green, red, blue: two symbols, lo first
        put(1, 1)
        put(1, 1)
        put(1, 1)
        put(lo, 8)
        put(hi, 8)
    if p.alpha:  # alpha: 0 or 255, one bit a pixel
        put(1, 1)
        put(1, 1)
        put(1, 1)
        put(0, 8)
        put(255, 8)
    for sym in ((0,) if p.alpha else (255, 0)):  # (alpha,) distance: one symbol, no bits
        put(1, 1)
        put(0, 1)
        put(1, 1)
        put(sym, 8)
    # a pixel is its green, red and blue bits (low bit first); a tile's run is one pattern
    # repeated, built as a geometric series
    for r in range(len(p.ys) - 1):
        line = 0
        shift = 0
        for c in range(len(p.xs) - 1):
            n = p.xs[c + 1] - p.xs[c]
            b = p.bits[r][c]
            if p.alpha:  # green, red, blue, then alpha (opaque unless the bits are 0)
                line |= ((b | (8 if b else 0)) * (((1 << (4 * n)) - 1) // 15)) << shift
                shift += 4 * n
            else:
                line |= (b * (((1 << (3 * n)) - 1) // 7)) << shift
                shift += 3 * n
        for _ in range(p.ys[r + 1] - p.ys[r]):
            put(line, shift)
            if nbits >= 4096:
                k = nbits // 8
                out += (acc & ((1 << (8 * k)) - 1)).to_bytes(k, "little")
                acc >>= 8 * k
                nbits -= 8 * k
        yield p.width * (p.ys[r + 1] - p.ys[r])
    out += acc.to_bytes((nbits + 7) // 8, "little")
    body = bytes(out)
    chunk = b"VP8L" + struct.pack("<I", len(body)) + body + (b"\x00" if len(body) % 2 else b"")
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk
