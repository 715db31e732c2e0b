"""A synthetic voice and the audio containers of ``/v1/audio/speech``, standard library only.

:func:`speak` turns text into 24 kHz mono 16-bit PCM (the real API's ``pcm``): each word a
tone (its pitch from the voice and the word) as long as the word takes to say at the voice's
rate, a short pause after each word and a longer one after a sentence. A period of each tone
is computed once and repeated, so minutes of audio cost milliseconds. :func:`words_per_second`
is the voice's speaking rate (~150 words a minute at ``speed`` 1, assumption from common
speech-rate figures) and :func:`spoken_seconds` the length a text takes.

The containers (:func:`encode`): ``pcm`` raw, ``wav`` (RIFF PCM), ``flac`` (verbatim
subframes with STREAMINFO and the samples' MD5), and, silent at the same duration, ``mp3``
(MPEG-2 Layer III 32 kbit/s frames with empty side information), ``opus`` (Ogg Opus, 20 ms
silence packets) and ``aac`` (ADTS AAC-LC frames with an empty single channel element).

:func:`wav_seconds` reads a WAV upload's duration from its header (transcriptions).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Generator

__all__ = ["RATE", "FORMATS", "CONTENT_TYPES", "VOICES", "speak", "encode", "spoken_seconds",
           "words_per_second", "wav_seconds", "word_times"]

RATE = 24_000
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac",
                 "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}
# base pitch (Hz) and speaking rate (words/s at speed 1) of each built-in voice (assumption)
VOICES = {"alloy": (180, 2.5), "ash": (130, 2.45), "ballad": (150, 2.3), "coral": (210, 2.55),
          "echo": (120, 2.5), "fable": (170, 2.4), "onyx": (100, 2.35), "nova": (220, 2.6),
          "sage": (190, 2.45), "shimmer": (230, 2.5), "verse": (140, 2.5),
          "marin": (200, 2.5), "cedar": (125, 2.45)}
WORD_GAP_S = 0.06
SENTENCE_GAP_S = 0.3
AMPLITUDE = 8000

Encoded = Generator[int, None, bytes]


def words_per_second(voice: str, speed: float) -> float:
    return VOICES.get(voice, (160, 2.5))[1] * speed


def word_times(text: str, voice: str, speed: float) -> list[tuple[str, float, float]]:
    """Each word of ``text`` with its start and end (seconds) in the spoken audio."""
    rate = words_per_second(voice, speed)
    out = []
    t = 0.0
    for w in text.split():
        # a word's share of the average word's time follows its length (5 letters average)
        d = max(0.08, min(len(w), 20) / 5.0) / rate - WORD_GAP_S / speed
        d = max(d, 0.05)
        out.append((w, t, t + d))
        t += d + (SENTENCE_GAP_S if w[-1] in ".!?" else WORD_GAP_S) / speed
    return out


def spoken_seconds(text: str, voice: str = "alloy", speed: float = 1.0) -> float:
    times = word_times(text, voice, speed)
    return times[-1][2] if times else 0.0


def _tone(freq: float, seconds: float) -> bytes:
    period = max(8, round(RATE / freq))
    one = struct.pack(f"<{period}h", *(round(AMPLITUDE * math.sin(2 * math.pi * i / period))
                                       for i in range(period)))
    n = round(seconds * RATE)
    return (one * (n // period + 1))[:2 * n]


def speak(text: str, voice: str, speed: float) -> bytes:
    """The PCM (s16le, 24 kHz, mono) of ``text`` in ``voice`` at ``speed``."""
    base = VOICES.get(voice, (160, 2.5))[0]
    out = []
    t = 0.0
    for w, start, end in word_times(text, voice, speed):
        if start > t:
            out.append(b"\0\0" * round((start - t) * RATE))
        lift = hashlib.blake2b(w.lower().encode(), digest_size=1).digest()[0] / 255
        out.append(_tone(base * (1 + 0.5 * lift), end - start))
        t = end
    return b"".join(out)


def wav(pcm: bytes, rate: int = RATE) -> bytes:
    return (b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data" + struct.pack("<I", len(pcm)) + pcm)


def wav_seconds(data: bytes) -> float | None:
    """The duration of a PCM WAV file from its header, or None when it is not one."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos = 12
    byte_rate = 0
    for _ in range(64):  # chunks read before giving up
        if pos + 8 > len(data):
            return None
        cid, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        if cid == b"fmt " and size >= 16:
            byte_rate = struct.unpack("<I", data[pos + 16:pos + 20])[0]
        elif cid == b"data":
            if not byte_rate:
                return None
            size = min(size, len(data) - pos - 8)  # a streamed WAV's size may be a placeholder
            return size / byte_rate
        pos += 8 + size + (size & 1)
    return None


# -- FLAC ------------------------------------------------------------------------------------

FLAC_BLOCK = 4096


def _crc_table(poly: int, width: int) -> list[int]:
    top = 1 << (width - 1)
    mask = (1 << width) - 1
    table = []
    for i in range(256):
        c = i << (width - 8)
        for _ in range(8):
            c = ((c << 1) ^ poly) if c & top else c << 1
        table.append(c & mask)
    return table


_CRC8 = _crc_table(0x07, 8)
_CRC16 = _crc_table(0x8005, 16)
_CRC32 = _crc_table(0x04C11DB7, 32)


def _crc8(data: bytes) -> int:
    c = 0
    for b in data:
        c = _CRC8[c ^ b]
    return c


_CRC16_WORDS: list[int] = []


def _crc16(data: bytes) -> int:
    """CRC-16 (FLAC's: polynomial 0x8005, no reflection), two bytes a step: the CRC is 16
    bits, so one step is a lookup of (crc ^ word) in a 65536-entry table built once."""
    t = _CRC16
    if not _CRC16_WORDS:
        for x in range(65536):
            c = t[x >> 8]
            _CRC16_WORDS.append(((c << 8) & 0xFFFF) ^ t[(c >> 8) ^ (x & 0xFF)])
    words = _CRC16_WORDS
    n = len(data) // 2
    c = 0
    for w in struct.unpack(f">{n}H", data[:2 * n]):
        c = words[c ^ w]
    if len(data) & 1:
        c = ((c << 8) & 0xFFFF) ^ t[(c >> 8) ^ data[-1]]
    return c


def _crc32(data: bytes) -> int:
    c = 0
    t = _CRC32
    for b in data:
        c = ((c << 8) & 0xFFFFFFFF) ^ t[(c >> 24) ^ b]
    return c


def _utf8_number(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    return chr(n).encode("utf-8") if n < 0x110000 and not 0xD800 <= n < 0xE000 else \
        _utf8_long(n)


def _utf8_long(n: int) -> bytes:
    # the FLAC "UTF-8" coding goes past Unicode's range (and through its surrogates)
    for length, lead in ((3, 0xE0), (4, 0xF0), (5, 0xF8), (6, 0xFC), (7, 0xFE)):
        if n < 1 << (5 * length + 1 if length < 7 else 36):
            out = []
            for _ in range(length - 1):
                out.append(0x80 | (n & 0x3F))
                n >>= 6
            return bytes([lead | n] + out[::-1])
    raise ValueError("frame number too large")


def flac(pcm: bytes) -> Encoded:
    samples = len(pcm) // 2
    out = [b"fLaC", b"\x80\x00\x00\x22",
           struct.pack(">HH", FLAC_BLOCK, FLAC_BLOCK) + b"\0" * 6
           + ((RATE << 44) | (0 << 41) | (15 << 36) | samples).to_bytes(8, "big")
           + hashlib.md5(pcm).digest()]
    n = 0
    for start in range(0, samples, FLAC_BLOCK):
        block = pcm[2 * start:2 * (start + FLAC_BLOCK)]
        count = len(block) // 2
        head = (b"\xff\xf8\x77\x08" + _utf8_number(n) + struct.pack(">H", count - 1))
        head += bytes([_crc8(head)])
        # verbatim subframe: big-endian samples (the PCM is little-endian)
        be = bytearray(block)
        be[0::2], be[1::2] = block[1::2], block[0::2]
        frame = head + b"\x02" + bytes(be)
        out.append(frame + struct.pack(">H", _crc16(frame)))
        n += 1
        yield len(frame)
    return b"".join(out)


# -- silent compressed formats ---------------------------------------------------------------

def mp3(samples: int) -> bytes:
    """MPEG-2 Layer III, 24 kHz mono, 32 kbit/s: 576 samples in 96 bytes a frame."""
    frame = b"\xff\xf3\x44\xc0" + b"\0" * 92
    return frame * -(-samples // 576)


def aac(samples: int) -> bytes:
    """ADTS AAC-LC, 24 kHz mono: 1024 samples a frame, each an empty SCE then END."""
    # SCE tag 0, global_gain 100, ics_info (long window, max_sfb 0), no pulse/TNS/gain
    # control data, END: 32 bits
    bits = (0 << 29) | (0 << 25) | (100 << 17) | (0b111)
    raw = bits.to_bytes(4, "big")
    length = 7 + len(raw)
    # syncword, MPEG-4, layer 0, no CRC; LC, 24 kHz (index 6), mono; length; fullness 0x7FF
    hdr = ((0xFFF << 44) | (0 << 43) | (0 << 41) | (1 << 40) | (1 << 38) | (6 << 34)
           | (0 << 33) | (1 << 30) | (length << 13) | (0x7FF << 2) | 0)
    return (hdr.to_bytes(7, "big") + raw) * -(-samples // 1024)


def _ogg_page(kind: int, granule: int, serial: int, seq: int, packets: list[bytes]) -> bytes:
    lacing = bytearray()
    for p in packets:
        lacing += b"\xff" * (len(p) // 255) + bytes([len(p) % 255])
    page = (b"OggS\x00" + bytes([kind]) + struct.pack("<qIII", granule, serial, seq, 0)
            + bytes([len(lacing)]) + bytes(lacing) + b"".join(packets))
    return page[:22] + struct.pack("<I", _crc32(page)) + page[26:]


def opus(samples: int, serial: int = 0x11C5) -> bytes:
    """Ogg Opus of 20 ms silence packets (48 kHz granules, 312 samples pre-skip)."""
    pre_skip = 312
    head = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, pre_skip, RATE, 0, 0)
    tags = b"OpusTags" + struct.pack("<I", 6) + b"llmsim" + struct.pack("<I", 0)
    pages = [_ogg_page(0x02, 0, serial, 0, [head]), _ogg_page(0x00, 0, serial, 1, [tags])]
    packets = -(-samples * 2 // 960)  # 48 kHz samples / 960 a packet
    seq = 2
    done = 0
    while done < packets or seq == 2:
        k = min(50, packets - done)
        done += k
        last = done >= packets
        pages.append(_ogg_page(0x04 if last else 0x00, pre_skip + done * 960, serial, seq,
                               [b"\xf8\xff\xfe"] * k))
        seq += 1
    return b"".join(pages)


def encode(fmt: str, pcm: bytes) -> Encoded:
    """``pcm`` in the container ``fmt`` (a generator: see :mod:`llmsim.sim.imaging`)."""
    if fmt == "flac":
        return (yield from flac(pcm))
    yield len(pcm) // 64
    samples = len(pcm) // 2
    if fmt == "pcm":
        return pcm
    if fmt == "wav":
        return wav(pcm)
    if fmt == "mp3":
        return mp3(samples)
    if fmt == "aac":
        return aac(samples)
    return opus(samples)
