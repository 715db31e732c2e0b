"""Audio of the Realtime API, sans-IO: the formats, a server VAD and a synthetic voice.

Formats: ``audio/pcm`` (PCM16 little-endian, 24 kHz mono), ``audio/pcmu`` (G.711 μ-law, 8 kHz)
and ``audio/pcma`` (G.711 A-law, 8 kHz), as the SDK's ``RealtimeAudioFormats``.

The VAD (:class:`VAD`) reads the energy of the input audio: the RMS of each 20 ms frame against
a level set by ``threshold`` (0..1 maps -60..-10 dBFS; 0.5 is -35 dBFS), speech starting at
the first loud frame and stopping once ``silence_duration_ms`` of quiet frames followed it. It
keeps no audio: only the partial frame (< 20 ms) and counters, so a long buffer costs nothing.

The voice (:func:`speech`) says each piece of an answer as one tone per syllable (a pitch of
the voice's scale drawn from the seeded RNG), a short pause between words and a longer one after
punctuation, at about 170 words a minute (``speed`` scales it): the audio lasts what the
words would take to say, deterministic from the seed.
"""

from __future__ import annotations

import array
import math
import operator
import random
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["FORMATS", "rate_of", "bytes_per_ms", "VAD", "Speech", "speech", "VOICES",
           "AUDIO_TOKENS_IN_PER_S", "AUDIO_TOKENS_OUT_PER_S", "rms_level"]

FORMATS = ("audio/pcm", "audio/pcmu", "audio/pcma")
PCM_RATE = 24000
G711_RATE = 8000
FRAME_MS = 20
STRIDE = 4  # the VAD reads every 4th sample of a frame
# billed audio tokens per second (the real models' published rates: ~600 tokens a minute of
# input audio, ~1200 a minute of output audio)
AUDIO_TOKENS_IN_PER_S = 10
AUDIO_TOKENS_OUT_PER_S = 20
VOICES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin",
          "cedar")
_PITCH = {"alloy": 190, "ash": 120, "ballad": 140, "coral": 210, "echo": 115, "sage": 200,
          "shimmer": 220, "verse": 130, "marin": 205, "cedar": 110}
SYLLABLE_S = 0.17  # one syllable at speed 1.0
WORD_GAP_S = 0.06  # between words
PAUSE_S = 0.22  # after , . ! ? ; :
AMPLITUDE = 9000
_BIG = sys.byteorder == "big"


def rate_of(fmt: str) -> int:
    return PCM_RATE if fmt == "audio/pcm" else G711_RATE


def bytes_per_ms(fmt: str) -> int:
    """Bytes of one millisecond of ``fmt`` (PCM16 at 24 kHz: 48; G.711 at 8 kHz: 8)."""
    return 48 if fmt == "audio/pcm" else 8


# -- G.711 -------------------------------------------------------------------------------------

def _ulaw_decode(u: int) -> int:
    u = ~u & 0xFF
    t = ((u & 0x0F) << 3) + 0x84
    t <<= (u & 0x70) >> 4
    return (0x84 - t) if u & 0x80 else (t - 0x84)


def _alaw_decode(a: int) -> int:
    a ^= 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    if seg == 0:
        t += 8
    elif seg == 1:
        t += 0x108
    else:
        t = (t + 0x108) << (seg - 1)
    return t if a & 0x80 else -t


_ULAW = [_ulaw_decode(i) for i in range(256)]
_ALAW = [_alaw_decode(i) for i in range(256)]
_ULAW_SQ = [v * v for v in _ULAW]
_ALAW_SQ = [v * v for v in _ALAW]


def _ulaw_encode(s: int) -> int:
    sign = 0x80 if s < 0 else 0
    s = min(32635, -s if s < 0 else s) + 0x84
    exp = 7
    mask = 0x4000
    while exp > 0 and not s & mask:
        exp -= 1
        mask >>= 1
    mant = (s >> (exp + 3)) & 0x0F
    return ~(sign | (exp << 4) | mant) & 0xFF


def _alaw_encode(s: int) -> int:
    sign = 0x80 if s >= 0 else 0
    s = min(32635, -s - 1 if s < 0 else s)
    if s < 256:
        v = s >> 4
    else:
        exp = 1
        while exp < 7 and s >= (256 << exp):
            exp += 1
        v = (exp << 4) | ((s >> (exp + 3)) & 0x0F)
    return (v | sign) ^ 0x55


_ENC: dict[str, bytes] = {}


def _encoder(fmt: str) -> bytes:
    """A table from ``(sample >> 2) & 0x3FFF`` (14-bit) to the G.711 byte (built once)."""
    t = _ENC.get(fmt)
    if t is None:
        enc = _ulaw_encode if fmt == "audio/pcmu" else _alaw_encode
        t = _ENC[fmt] = bytes(enc(((i ^ 0x2000) - 0x2000) << 2) for i in range(1 << 14))
    return t


# -- the VAD -----------------------------------------------------------------------------------

def rms_level(threshold: float) -> float:
    """The frame RMS (in 16-bit units) that counts as speech for a VAD ``threshold``."""
    return 32768.0 * 10 ** ((-60.0 + 50.0 * threshold) / 20.0)


@dataclass(slots=True)
class VADEvent:
    kind: str  # "start" | "stop"
    ms: int  # audio_start_ms / audio_end_ms (session audio time)


class VAD:
    """Speech start/stop from the energy of the appended audio (see the module doc)."""

    __slots__ = ("fmt", "frame_bytes", "level_sq", "prefix_ms", "silence_ms", "_partial",
                 "ms", "speaking", "quiet_ms", "speech_ms", "started_at")

    def __init__(self, fmt: str, threshold: float, prefix_ms: int, silence_ms: int) -> None:
        self.fmt = fmt
        self.frame_bytes = bytes_per_ms(fmt) * FRAME_MS
        lvl = rms_level(threshold)
        self.level_sq = lvl * lvl
        self.prefix_ms = prefix_ms
        self.silence_ms = silence_ms
        self._partial = b""  # (< one frame)
        self.ms = 0  # session audio time fed so far (whole frames)
        self.speaking = False
        self.quiet_ms = 0  # quiet since the last loud frame (while speaking)
        self.speech_ms = 0  # loud frames in the current turn
        self.started_at = 0

    def _energy(self, frame: bytes) -> float:
        """Mean square of one frame, from every ``STRIDE``-th sample (an estimate as good
        for speech versus silence, at a quarter of the work per byte a client sends)."""
        if self.fmt == "audio/pcm":
            a = array.array("h")
            a.frombytes(frame)
            if _BIG:
                a.byteswap()
            a = a[::STRIDE]
            return sum(map(operator.mul, a, a)) / max(1, len(a))
        sq = _ULAW_SQ if self.fmt == "audio/pcmu" else _ALAW_SQ
        b = frame[::STRIDE]
        return sum(map(sq.__getitem__, b)) / max(1, len(b))

    def feed(self, data: bytes) -> list[VADEvent]:
        """Run the VAD over ``data`` (appended audio); the events it decides, in order."""
        out: list[VADEvent] = []
        fb = self.frame_bytes
        if self._partial:
            data = self._partial + data
        n = len(data) - len(data) % fb
        self._partial = data[n:]
        for i in range(0, n, fb):
            loud = self._energy(data[i:i + fb]) >= self.level_sq
            if not self.speaking:
                if loud:
                    self.speaking = True
                    self.quiet_ms = 0
                    self.speech_ms = FRAME_MS
                    self.started_at = max(0, self.ms - self.prefix_ms)
                    out.append(VADEvent("start", self.started_at))
            elif loud:
                self.quiet_ms = 0
                self.speech_ms += FRAME_MS
            else:
                self.quiet_ms += FRAME_MS
                if self.quiet_ms >= self.silence_ms:
                    self.speaking = False
                    out.append(VADEvent("stop", self.ms + FRAME_MS))
            self.ms += FRAME_MS
        return out

    def skip(self, nbytes: int) -> None:
        """Audio time passes without VAD (turn detection off): count it only."""
        total = len(self._partial) + nbytes
        self.ms += (total // self.frame_bytes) * FRAME_MS
        self._partial = b"\0" * (total % self.frame_bytes)

    def reset_turn(self) -> None:
        """The buffer was committed or cleared: a new turn starts quiet."""
        self.speaking = False
        self.quiet_ms = self.speech_ms = 0


# -- the voice ---------------------------------------------------------------------------------

_VOWELS = re.compile(r"[aeiouyAEIOUY]+")
_LETTERS = re.compile(r"[A-Za-z0-9]")


def _syllables(piece: str) -> int:
    letters = len(_LETTERS.findall(piece))
    if not letters:
        return 0
    return max(1, len(_VOWELS.findall(piece)))


@dataclass(slots=True)
class Speech:
    """What the voice says for an answer: when each piece starts (seconds), how long it all
    lasts, and the tones (start sample, samples, frequency)."""

    starts: list[float]
    duration: float
    rate: int
    tones: list[tuple[int, int, int]]
    fmt: str

    @property
    def samples(self) -> int:
        return round(self.duration * self.rate)

    def chunks(self, chunk_ms: int) -> Iterator[bytes]:
        """The audio in ``fmt``, ``chunk_ms`` at a time, made as it is read: each chunk is
        silence with the rendered tones copied in (tones are rendered once per pitch and
        length, :func:`_tone`), so a stream's audio costs byte copies, not a loop per
        sample."""
        width = 2 if self.fmt == "audio/pcm" else 1
        per = self.rate * chunk_ms // 1000
        total = self.samples
        quiet = _SILENCE[self.fmt]
        tones = self.tones
        ti = 0
        pos = 0
        while pos < total:
            end = min(total, pos + per)
            buf = bytearray(quiet * (end - pos))
            while ti < len(tones) and tones[ti][0] + tones[ti][1] <= pos:
                ti += 1
            j = ti
            while j < len(tones) and tones[j][0] < end:
                start, n, f = tones[j]
                lo, hi = max(start, pos), min(start + n, end)
                if hi > lo:
                    t = _tone(f, n, self.rate, self.fmt)
                    buf[(lo - pos) * width:(hi - pos) * width] = \
                        t[(lo - start) * width:(hi - start) * width]
                j += 1
            pos = end
            yield bytes(buf)


_SILENCE = {"audio/pcm": b"\0\0", "audio/pcmu": b"\xff", "audio/pcma": b"\xd5"}
_TONES: dict[tuple[int, int, int, str], bytes] = {}
MAX_TONES = 512  # rendered tones kept (pitches × lengths × formats: a handful per voice)


def _tone(f: int, n: int, rate: int, fmt: str) -> bytes:
    """``n`` samples of a sine at ``f`` Hz with 5 ms fades, in ``fmt`` (cached)."""
    key = (f, n, rate, fmt)
    t = _TONES.get(key)
    if t is None:
        sine = _sine_table(rate)
        ramp = max(1, rate // 200)
        a = array.array("h", (int(sine[(k * f) % rate] * min(1.0, k / ramp, (n - k) / ramp))
                              for k in range(n)))
        if fmt != "audio/pcm":
            enc = _encoder(fmt)
            t = bytes(enc[(v >> 2) & 0x3FFF] for v in a)
        else:
            if _BIG:
                a.byteswap()
            t = a.tobytes()
        if len(_TONES) >= MAX_TONES:
            _TONES.clear()
        _TONES[key] = t
    return t


_SINES: dict[int, list[int]] = {}


def _sine_table(rate: int) -> list[int]:
    t = _SINES.get(rate)
    if t is None:
        t = _SINES[rate] = [int(AMPLITUDE * math.sin(2 * math.pi * i / rate))
                            for i in range(rate)]
    return t


def speech(pieces: list[str], voice: str, speed: float, fmt: str,
           rng: random.Random) -> Speech:
    """The voice's rendering of ``pieces`` (see the module doc)."""
    rate = rate_of(fmt)
    base = _PITCH.get(voice, 170)
    syl = SYLLABLE_S / speed
    n = round(syl * rate * 0.9)
    t = 0.0
    starts: list[float] = []
    tones: list[tuple[int, int, int]] = []
    for p in pieces:
        if p[:1].isspace() and t > 0:
            t += WORD_GAP_S / speed
        starts.append(t)
        for _ in range(_syllables(p)):
            # a pitch of the voice's scale (a few semitones around its base)
            f = round(base * 2 ** (rng.randrange(-3, 6) / 12))
            tones.append((round(t * rate), n, f))
            t += syl
        if p.rstrip()[-1:] in (",", ".", "!", "?", ";", ":"):
            t += PAUSE_S / speed
    return Speech(starts, t, rate, tones, fmt)
