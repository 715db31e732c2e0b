"""Tests for llmsim.sim.tokens (exact parts are skipped when tiktoken is unavailable)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from random import Random

import pytest

from llmsim.sim import tokens as T

ENCODINGS = ("cl100k_base", "o200k_base")

SAMPLES = [
    "",
    "a",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "line one\nline two\r\n\r\nthird\tline\n\n\n",
    "internationalization antidisestablishmentarianism supercalifragilistic",
    "numbers 1 12 123 1234 12345 3.14159 -42 1e10 0x1F",
    "héllo wörld, façade naïve café",
    "日本語のテキストです。中文文本。한국어 텍스트",
    "emoji 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤖",
    "math ∑∫√∞ ≠ ≤ ≥ and arrows → ← ⇒",
    "special <|endoftext|> <|fim_prefix|> tokens as text",
    "code: def f(x):\n    return x ** 2  # comment\n",
    '{"json": [1, 2, {"k": null}], "s": "it\'s"}',
    "don't can't we'll they've I'm you'd HE'S",
    "\x00\x01 control \x7f chars \u200b zero width \u00a0 nbsp \u3000 ideographic",
    "Ωμέγα кириллица עברית العربية हिन्दी",
    " ",
    "\n",
    "...!!!???---",
]


def _both():
    pytest.importorskip("tiktoken")
    encs = [T.get_encoding(n) for n in ENCODINGS]
    if any(e is None for e in encs):
        pytest.skip("tiktoken rank files not available offline")
    return encs


# ---------------------------------------------------------------------------
# (a) Assertions that hold with or without tiktoken
# ---------------------------------------------------------------------------


def test_vocabulary_shape():
    assert len(T.WORDS) >= 200
    assert len(set(T.WORDS)) == len(T.WORDS)
    for w in T.WORDS:
        assert w.startswith(" ") and w[1:].isalpha() and w[1:].islower(), w
    assert len(T.FIRST_WORDS) >= 25
    for w in T.FIRST_WORDS:
        assert w.isalpha() and w[0].isupper(), w
    assert T.CAP_WORDS == tuple(" " + w for w in T.FIRST_WORDS)
    assert T.PUNCT == (",", ".")


@pytest.mark.parametrize("n", [0, 1, 2, 5, 17, 100, 1000])
def test_lorem_pieces_count_and_shape(n):
    pieces = T.lorem_pieces(n, Random(n))
    assert len(pieces) == n
    if n:
        assert pieces[0] in T.FIRST_WORDS
    allowed = set(T.WORDS) | set(T.PUNCT) | set(T.CAP_WORDS) | set(T.FIRST_WORDS)
    assert set(pieces) <= allowed
    for prev, cur in zip(pieces, pieces[1:], strict=False):
        assert not (prev in T.PUNCT and cur in T.PUNCT)
        if prev == ".":
            assert cur in T.CAP_WORDS
        if cur in T.CAP_WORDS:
            assert prev == "."
    text = "".join(pieces)
    assert text == "".join(pieces)
    assert "  " not in text


def test_lorem_sentence_lengths():
    pieces = T.lorem_pieces(5000, Random(7))
    lengths = []
    cur = 0
    for p in pieces:
        cur += 1
        if p == ".":
            lengths.append(cur)
            cur = 0
    assert lengths and min(lengths) >= 6 and max(lengths) <= 18
    assert "," in pieces


def test_lorem_deterministic():
    assert T.lorem_pieces(300, Random(42)) == T.lorem_pieces(300, Random(42))
    assert T.lorem_pieces(300, Random(1)) != T.lorem_pieces(300, Random(2))


def test_sequence_pieces():
    assert T.sequence_pieces(0) == []
    assert T.sequence_pieces(5) == ["1", ",", "2", ",", "3"]
    assert "".join(T.sequence_pieces(7)) == "1,2,3,4"
    assert T.sequence_pieces(3, start=1) == [",", "2", ","]
    full = T.sequence_pieces(5000)
    assert len(full) == 5000
    for a in (0, 1, 2, 999, 1998, 2001):
        assert T.sequence_pieces(a) + T.sequence_pieces(5000 - a, start=a) == full
    nums = [int(p) for p in full if p != ","]
    assert max(nums) == 999 and min(nums) == 1
    assert nums[998:1001] == [999, 1, 2]


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_split_pieces_roundtrip(text, encoding):
    pieces, count = T.split_pieces_counted(text, encoding)
    assert "".join(pieces) == text
    assert T.split_pieces(text, encoding) == pieces
    assert all(pieces)
    assert count >= len(pieces)
    assert T.count_tokens(text, encoding) == count
    if text:
        assert count > 0


@pytest.mark.parametrize("text", SAMPLES)
def test_estimate_roundtrip(text, monkeypatch):
    monkeypatch.setattr(T, "get_encoding", lambda name: None)
    pieces, count = T.split_pieces_counted(text)
    assert "".join(pieces) == text
    assert count == len(pieces) == T.count_tokens(text)
    assert all(pieces)
    if text:
        assert count > 0


def test_estimate_random_unicode(monkeypatch):
    monkeypatch.setattr(T, "get_encoding", lambda name: None)
    rng = Random(3)
    alphabet = "ab Z09 ,.!\n\t\r'é世👍\u200d\U0001f3fd\x00_-"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        assert "".join(T.split_pieces(text)) == text


def test_estimate_is_reasonable(monkeypatch):
    text = "".join(T.lorem_pieces(500, Random(5)))
    monkeypatch.setattr(T, "get_encoding", lambda name: None)
    est = T.count_tokens(text)
    assert 400 <= est <= 650
    long_word = T.split_pieces(" internationalization")
    assert len(long_word) > 1 and long_word[0].startswith(" ")


def test_count_tokens_positive():
    assert T.count_tokens("") == 0
    assert T.count_tokens("Hello world") > 0
    assert T.count_tokens("Hello world", "cl100k_base") > 0


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-4", "cl100k_base"),
        ("gpt-4-0613", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-4-32k", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("gpt-3.5-turbo-instruct", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
        ("text-embedding-3-large", "cl100k_base"),
        ("text-embedding-ada-002", "cl100k_base"),
        ("ft:gpt-3.5-turbo:org::abc", "cl100k_base"),
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4.1", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o1", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("my-custom-model", "o200k_base"),
        ("", "o200k_base"),
    ],
)
def test_encoding_for_model(model, expected):
    assert T.encoding_for_model(model) == expected


def test_unknown_encoding_falls_back():
    assert T.get_encoding("no_such_encoding") is None
    assert T.count_tokens("hello world", "no_such_encoding") > 0


# ---------------------------------------------------------------------------
# (b) Exact assertions (need tiktoken + offline rank files)
# ---------------------------------------------------------------------------


def test_is_exact():
    _both()
    assert T.is_exact()


def test_get_encoding_cached():
    _both()
    for n in ENCODINGS:
        assert T.get_encoding(n) is T.get_encoding(n)


def test_vocabulary_single_tokens():
    encs = _both()
    for enc in encs:
        for p in T.WORDS + T.FIRST_WORDS + T.CAP_WORDS + T.PUNCT:
            assert len(enc.encode_ordinary(p)) == 1, (enc.name, p)


def test_vocabulary_all_adjacent_pairs():
    """Every adjacency the lorem grammar can produce keeps one token per element."""
    encs = _both()
    single = {
        p: [e.encode_ordinary(p)[0] for e in encs]
        for p in set(T.WORDS + T.FIRST_WORDS + T.CAP_WORDS + T.PUNCT)
    }

    def check(seq):
        s = "".join(seq)
        for i, e in enumerate(encs):
            assert e.encode_ordinary(s) == [single[x][i] for x in seq], (e.name, seq)

    for a in T.FIRST_WORDS + T.CAP_WORDS + T.WORDS:
        for b in T.WORDS + T.PUNCT:
            check([a, b])
    for b in T.CAP_WORDS:
        check([".", b])
        for a in T.FIRST_WORDS + T.WORDS[:40]:
            check([a, ".", b])
    for b in T.WORDS:
        check([",", b])


def test_lorem_exact_token_counts():
    """200 seeds x lengths 1..300, both encodings: token count == piece count."""
    encs = _both()
    for seed in range(200):
        full = T.lorem_pieces(300, Random(seed))
        for n in (1, 7, 150, 299):  # generation is prefix-stable: n pieces == full[:n]
            assert T.lorem_pieces(n, Random(seed)) == full[:n]
        for n in range(1, 301):
            text = "".join(full[:n])
            for enc in encs:
                assert len(enc.encode(text)) == n, (enc.name, seed, n)


def test_lorem_pieces_are_tokens():
    encs = _both()
    for seed in range(20):
        pieces = T.lorem_pieces(300, Random(seed))
        text = "".join(pieces)
        for enc in encs:
            assert [enc.decode([t]) for t in enc.encode(text)] == pieces


def test_sequence_exact():
    encs = _both()
    for n in (1, 2, 3, 10, 101, 1997, 1998, 1999, 3000):
        for start in (0, 1, 1500):
            pieces = T.sequence_pieces(n, start)
            text = "".join(pieces)
            for enc in encs:
                assert [enc.decode([t]) for t in enc.encode(text)] == pieces, (enc.name, n, start)
    for enc in encs:
        for p in set(T.sequence_pieces(2000)):
            assert len(enc.encode(p)) == 1, (enc.name, p)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_split_pieces_counted_exact(encoding):
    _both()
    enc = T.get_encoding(encoding)
    rng = Random(11)
    texts = list(SAMPLES)
    alphabet = "ab Z09 ,.!\n\t'é世界👍🏽\u200d字ü"
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(200)]
    for text in texts:
        pieces, count = T.split_pieces_counted(text, encoding)
        assert "".join(pieces) == text
        assert count == len(enc.encode_ordinary(text))
        assert T.count_tokens(text, encoding) == count
    # ASCII text: exactly one piece per token
    ascii_text = "The quick brown fox, 12345 jumps!\n  over the lazy dog's back."
    pieces, count = T.split_pieces_counted(ascii_text, encoding)
    assert len(pieces) == count


def test_exact_special_tokens_are_plain_text():
    _both()
    assert T.count_tokens("<|endoftext|>") > 1


def test_get_encoding_offline_fresh_process(tmp_path):
    """A fresh load succeeds with sockets and tiktoken's downloader disabled."""
    _both()
    code = textwrap.dedent(
        """
        import socket, time
        def boom(*a, **k):
            raise AssertionError("network access attempted")
        socket.socket.connect = boom
        socket.socket.connect_ex = boom
        socket.create_connection = boom
        socket.getaddrinfo = boom
        import tiktoken.load
        tiktoken.load.read_file = boom
        from llmsim.sim import tokens as T
        t = time.perf_counter()
        for name in ("o200k_base", "cl100k_base"):
            enc = T.get_encoding(name)
            assert enc is not None, name
            assert enc.decode(enc.encode("hello world")) == "hello world"
        assert T.is_exact()
        print(f"loaded in {time.perf_counter() - t:.3f}s")
        """
    )
    env = dict(os.environ)
    env["TIKTOKEN_CACHE_DIR"] = str(tmp_path)  # empty: must fall back to bundled data
    env.pop("DATA_GYM_CACHE_DIR", None)
    env.pop("LLMSIM_TOKENIZER", None)
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert r.returncode == 0, r.stderr
    assert "loaded in" in r.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written to tiktoken's cache


def test_get_encoding_from_tiktoken_cache_dir(tmp_path):
    """A rank file in TIKTOKEN_CACHE_DIR is used (bpe_openai hidden)."""
    _both()
    import gzip
    import hashlib

    data_dir = T._bpe_openai_data_dir()
    if data_dir is None:
        pytest.skip("bpe_openai data not available")
    name = "cl100k_base"
    key = hashlib.sha1(T._URL.format(name).encode()).hexdigest()
    with open(os.path.join(data_dir, name + ".tiktoken.gz"), "rb") as f:
        (tmp_path / key).write_bytes(gzip.decompress(f.read()))
    code = textwrap.dedent(
        """
        import sys
        sys.modules["bpe_openai"] = None
        import tiktoken.load
        def boom(*a, **k):
            raise AssertionError("network access attempted")
        tiktoken.load.read_file = boom
        from llmsim.sim import tokens as T
        assert T._bpe_openai_data_dir() is None
        assert T.get_encoding("cl100k_base") is not None
        """
    )
    env = dict(os.environ)
    env["TIKTOKEN_CACHE_DIR"] = str(tmp_path)
    env.pop("LLMSIM_TOKENIZER", None)
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert r.returncode == 0, r.stderr


def test_disable_env_forces_estimate():
    code = (
        "from llmsim.sim import tokens as T\n"
        "assert T.get_encoding('o200k_base') is None and not T.is_exact()\n"
        "assert T.count_tokens('hello world') == 2\n"
    )
    env = dict(os.environ, LLMSIM_TOKENIZER="estimate")
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert r.returncode == 0, r.stderr


def test_get_encoding_thread_safe_single_load():
    _both()
    code = textwrap.dedent(
        """
        import threading
        from llmsim.sim import tokens as T
        calls = []
        orig = T._load
        def counting(name):
            calls.append(name)
            return orig(name)
        T._load = counting
        results = []
        barrier = threading.Barrier(8)
        def worker():
            barrier.wait()
            results.append(T.get_encoding("o200k_base"))
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert calls == ["o200k_base"], calls
        assert results[0] is not None and all(r is results[0] for r in results)
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------
# Hot-path forms must not change what they compute
# ---------------------------------------------------------------------------

def _reference_lorem(n: int, rng: Random) -> list[str]:
    """The lorem sentences as first written with the ``random`` API (randint, choices,
    choice): the inlined form must give the same pieces and leave the RNG in the same
    state."""
    out: list[str] = []
    index = {w: i for i, w in enumerate(T.WORDS)}
    while len(out) < n:
        length = rng.randint(6, 18)
        body = rng.choices(T.WORDS, k=length - 2)
        for i in range(1, len(body)):
            if body[i] == body[i - 1]:
                body[i] = T.WORDS[(index[body[i]] + 1) % len(T.WORDS)]
        if rng.random() < 0.1 * (length - 4):
            body[rng.randint(1, length - 4)] = ","
        out.append(rng.choice(T.CAP_WORDS))
        out.extend(body)
        out.append(".")
    return out


def test_lorem_sentences_draw_as_the_random_api():
    for seed in range(400):
        for n in (0, 1, 16, 17, 100):
            a, b = Random(seed), Random(seed)
            assert T._lorem_sentences(n, a) == _reference_lorem(n, b), (seed, n)
            assert a.getstate() == b.getstate(), (seed, n)


def test_lorem_pieces_is_one_draw_and_a_window_of_the_ring():
    corpus, starts = T.lorem_ring()
    assert corpus == _reference_lorem(T.LOREM_CORPUS, Random(0x10AE))  # whole sentences
    assert starts[0] == 0 and all(corpus[i - 1] == "." for i in starts[1:])
    for seed in range(50):
        a, b = Random(seed), Random(seed)
        out = T.lorem_pieces(40, a)
        b.random()  # exactly one draw
        assert a.getstate() == b.getstate()
        at = starts[int(Random(seed).random() * len(starts))]
        assert out[1:] == corpus[at + 1:at + 40] and out[0] == corpus[at][1:]
    assert T.lorem_pieces(0, Random(1)) == []


def test_lorem_pieces_wraps_the_ring_at_a_sentence_seam():
    corpus, starts = T.lorem_ring()

    class Last(Random):  # picks the ring's last sentence
        def random(self) -> float:
            return (len(starts) - 0.5) / len(starts)

    out = T.lorem_pieces(300, Last())
    tail = len(corpus) - starts[-1]
    assert out[tail:] == corpus[:300 - tail] and out[tail] in T.CAP_WORDS
    long = T.lorem_pieces(2 * len(corpus) + 5, Random(3))  # longer than the ring
    assert len(long) == 2 * len(corpus) + 5
    for enc in _both():
        assert len(enc.encode("".join(out))) == 300


def test_short_count_cache_is_per_encoding_and_mode(monkeypatch):
    """Short texts are counted once per tokenizer: the same text counted with the other
    encoding, or estimated, is not answered from the first count."""
    encs = _both()
    T._short_counts.clear()
    for text in ("日本語のテキスト", "Ωμέγα кириллица", "emoji 👍🏽"):
        for enc in encs + encs[::-1]:
            assert T.count_tokens(text, enc.name) == len(enc.encode_ordinary(text))
    with monkeypatch.context() as m:
        m.setattr(T, "get_encoding", lambda name: None)
        assert T.count_tokens("Ωμέγα кириллица", "o200k_base") == \
            len(T._estimate_pieces("Ωμέγα кириллица")) == 15
    assert T.count_tokens("Ωμέγα кириллица", "o200k_base") == 6
    T._short_counts.clear()
    with monkeypatch.context() as m:
        m.setattr(T, "get_encoding", lambda name: None)
        assert T.count_tokens("Ωμέγα кириллица", "o200k_base") == 15
    assert T.count_tokens("Ωμέγα кириллица", "o200k_base") == 6


def test_short_count_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(T, "SHORT_COUNT_ENTRIES", 8)
    T._short_counts.clear()
    for i in range(50):
        assert T.count_tokens(f"w{i}") >= 1
    assert len(T._short_counts) <= 8


def test_draw_length_draws_as_lognormvariate():
    import math

    from llmsim.sim import text as txt
    for seed in range(500):
        for mean, sigma in ((200.0, 0.5), (5.3, 1.2), (900.0, 0.05)):
            a, b = Random(seed), Random(seed)
            mu = math.log(mean) - sigma * sigma / 2.0
            want = int(min(4096, max(1, round(b.lognormvariate(mu, sigma)))))
            assert txt.draw_length(a, mean, sigma, 1, 4096) == want
            assert a.getstate() == b.getstate()
