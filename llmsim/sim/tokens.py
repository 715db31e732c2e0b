"""Token accounting and token-exact synthetic text for llmsim.

Nothing in this module ever touches the network.

Exact mode
    When :mod:`tiktoken` is importable, :func:`get_encoding` builds a real
    ``tiktoken.Encoding`` for ``cl100k_base`` / ``o200k_base`` *by itself* from a
    local BPE rank file, looked up in this order (each candidate is verified
    against the official SHA-256 before use):

    1. ``$TIKTOKEN_CACHE_DIR/<sha1(url)>`` (tiktoken's own cache layout), if the
       variable is set and the file exists;
    2. tiktoken's default cache (``$DATA_GYM_CACHE_DIR`` or
       ``<tmpdir>/data-gym-cache``), if the file exists;
    3. the gzipped rank files shipped inside the ``bpe-openai`` wheel
       (``bpe_openai/data/<name>.tiktoken.gz``), decompressed in memory.

    The regex pattern and special tokens are copied from
    ``tiktoken_ext.openai_public`` so tiktoken's downloader is never invoked.
    Neither tiktoken nor bpe-openai is a runtime dependency (extra ``tokens``).
    ``--tokenizer estimate`` (env ``LLMSIM_TOKENIZER=estimate``, or :func:`use_mode` per context)
    forces estimate mode: no rank files are loaded (start-up ~0.4 s faster).

Estimate mode
    Without tiktoken, :func:`count_tokens` / :func:`split_pieces` use a regex that
    mimics the encodings' pre-tokenizer (see :func:`_estimate_pieces`). Counts are
    then approximations (typically within ~10-20% for English text).

Synthetic text
    :data:`WORDS`, :data:`FIRST_WORDS`, :data:`CAP_WORDS` and :data:`PUNCT` were
    selected offline with tiktoken so that every element is exactly one token in
    BOTH ``cl100k_base`` and ``o200k_base``, and so that any sentence built by the
    grammar of :func:`lorem_pieces` tokenizes to exactly one token per element.
    The tuples are hard-coded: generating text never needs tiktoken.
"""

from __future__ import annotations

import binascii
import contextvars
import gzip
import hashlib
import importlib.util
import os
import random
import re
import tempfile
import threading
from collections.abc import Generator, Iterator
from operator import is_
from typing import Any, TypeVar

__all__ = [
    "CAP_WORDS",
    "FIRST_WORDS",
    "PUNCT",
    "SEQUENCE_SEPARATOR",
    "WORDS",
    "Bound",
    "CHUNK_CHARS",
    "MAX_TOKEN_BYTES",
    "count_tokens",
    "count_tokens_steps",
    "run_steps",
    "encoding_for_model",
    "get_encoding",
    "is_exact",
    "lorem_pieces",
    "sequence_pieces",
    "split_pieces",
    "split_pieces_counted",
    "use_mode",
]

# ---------------------------------------------------------------------------
# Offline tiktoken loading
# ---------------------------------------------------------------------------

_T = TypeVar("_T")

_ENDOFTEXT = "<|endoftext|>"
_FIM_PREFIX = "<|fim_prefix|>"
_FIM_MIDDLE = "<|fim_middle|>"
_FIM_SUFFIX = "<|fim_suffix|>"
_ENDOFPROMPT = "<|endofprompt|>"

_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"

# Copied from tiktoken_ext.openai_public (tiktoken 0.x).
_SPECS: dict[str, dict[str, Any]] = {
    "cl100k_base": {
        "sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "pat_str": (
            r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
            r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
        ),
        "special_tokens": {
            _ENDOFTEXT: 100257,
            _FIM_PREFIX: 100258,
            _FIM_MIDDLE: 100259,
            _FIM_SUFFIX: 100260,
            _ENDOFPROMPT: 100276,
        },
    },
    "o200k_base": {
        "sha256": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "pat_str": "|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        "special_tokens": {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    },
}

_lock = threading.Lock()
_cache: dict[str, Any] = {}  # name -> Encoding | None (None = tried and failed)


def _candidate_files(name: str) -> list[tuple[str, bool]]:
    """Local files that may hold the ranks of ``name``: (path, gzipped)."""
    key = hashlib.sha1(_URL.format(name).encode()).hexdigest()
    out: list[tuple[str, bool]] = []
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        d = os.environ.get(var)
        if d:
            out.append((os.path.join(d, key), False))
    out.append((os.path.join(tempfile.gettempdir(), "data-gym-cache", key), False))
    data_dir = _bpe_openai_data_dir()
    if data_dir:
        out.append((os.path.join(data_dir, name + ".tiktoken.gz"), True))
    return out


def _bpe_openai_data_dir() -> str | None:
    """Directory of bpe_openai's bundled rank files, without importing the package."""
    try:
        spec = importlib.util.find_spec("bpe_openai")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        d = os.path.join(loc, "data")
        if os.path.isdir(d):
            return d
    return None


def _read_ranks(name: str) -> dict[bytes, int] | None:
    expected = _SPECS[name]["sha256"]
    for path, gz in _candidate_files(name):
        try:
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            if gz:
                data = gzip.decompress(data)
            if hashlib.sha256(data).hexdigest() != expected:
                continue
            # "b64token rank" per line; binascii directly is ~2x faster than
            # base64.b64decode over 200k lines (start-up time of the first request)
            fields = data.split()
            return dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2]),
                            strict=True))
        except (OSError, ValueError, EOFError):
            continue
    return None


def _load(name: str) -> Any:
    if name not in _SPECS:
        return None
    try:
        import tiktoken
    except ImportError:
        return None
    ranks = _read_ranks(name)
    if ranks is None:
        return None
    spec = _SPECS[name]
    try:
        return tiktoken.Encoding(
            name=name,
            pat_str=spec["pat_str"],
            mergeable_ranks=ranks,
            special_tokens=dict(spec["special_tokens"]),
        )
    except Exception:  # pragma: no cover - defensive (incompatible tiktoken)
        return None


def get_encoding(name: str) -> Any:
    """Return a ``tiktoken.Encoding`` for ``name`` or ``None``.

    Loaded lazily, at most once per name (also when it fails), thread-safe and
    strictly offline (see module docstring for where the ranks come from).
    Only ``cl100k_base`` and ``o200k_base`` are supported.
    """
    if _MODE.get() == "estimate":
        return None
    try:
        return _cache[name]
    except KeyError:
        pass
    if _estimate_only():
        return None
    with _lock:
        if name not in _cache:
            _cache[name] = _load(name)
        return _cache[name]


# the tokenizer mode of the app whose request runs now: a context variable, not process state,
# so two servers in one process (tests, load rigs) keep their own --tokenizer. ``App.dispatch``
# sets it from its app at the start of every request (the handler, the hooks and whatever they
# schedule run in that context). Unset: the LLMSIM_TOKENIZER env var.
_MODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("llmsim_tokenizer",
                                                                  default=None)
MODES = ("auto", "estimate")


def use_mode(mode: str) -> None:
    """``"auto"`` (exact with tiktoken when available) or ``"estimate"`` (never load it), for
    the current context only (see ``_MODE``): ``App.dispatch`` calls it with its app's mode."""
    if _MODE.get() != mode:
        if mode not in MODES:
            raise ValueError(f"tokenizer mode must be 'auto' or 'estimate', not {mode!r}")
        _MODE.set(mode)


def _estimate_only() -> bool:
    mode = _MODE.get() or os.environ.get("LLMSIM_TOKENIZER", "auto")
    return mode == "estimate"


def is_exact() -> bool:
    """True when token counts are exact (tiktoken and the rank files are available)."""
    return get_encoding("o200k_base") is not None and get_encoding("cl100k_base") is not None


def encoding_for_model(model: str) -> str:
    """Name of the encoding used by ``model``.

    ``cl100k_base`` for gpt-4 (but not gpt-4o / gpt-4.1 / gpt-4.5), gpt-3.5*,
    text-embedding-3* and text-embedding-ada-002; ``o200k_base`` for everything
    else (gpt-4o*, gpt-4.1*, gpt-5*, o1/o3/o4*, unknown models).
    """
    m = model.lower().strip()
    if "/" in m:  # e.g. "openai/gpt-4"
        m = m.rsplit("/", 1)[1]
    if m.startswith("ft:"):  # fine-tuned: ft:gpt-3.5-turbo:org::id
        m = m[3:]
    if m.startswith(("gpt-3.5", "gpt-35", "text-embedding-3", "text-embedding-ada")):
        return "cl100k_base"
    if m.startswith("gpt-4") and not m.startswith(("gpt-4o", "gpt-4.")):
        return "cl100k_base"
    return "o200k_base"


# ---------------------------------------------------------------------------
# Counting and splitting
# ---------------------------------------------------------------------------

# Estimate-mode pre-tokenizer, modelled on cl100k/o200k's regex with stdlib ``re``
# (which lacks \p{..}): contractions, ASCII words with an optional leading space,
# digit runs of 1-3, ASCII punctuation runs with an optional leading space, every
# non-ASCII character on its own (CJK is ~1 token per character; emoji and rarer
# scripts are usually more, so those are under-estimated), then whitespace runs.
_EST_RE = re.compile(
    r"""'(?:[sdmtSDMT]|ll|ve|re|LL|VE|RE)"""
    r"""| ?[A-Za-z]+"""
    r"""|[0-9]{1,3}"""
    r"""| ?[!-/:-@\[-`{-~]+"""
    r"""|[^\x00-\x7f]"""
    r"""|\s*[\r\n]+"""
    r"""|\s+(?!\S)"""
    r"""|\s+"""
    r"""|.""",
    re.DOTALL,
)
_EST_WORD_CHUNK = 6  # long words are cut every 6 letters (leading space goes with the first)


def _estimate_pieces(text: str) -> list[str]:
    pieces: list[str] = []
    for m in _EST_RE.finditer(text):
        p = m.group()
        letters = len(p) - (p[0] == " ")
        if letters > _EST_WORD_CHUNK + 1 and p[-1].isascii() and p[-1].isalpha():
            start = len(p) - letters
            first = start + _EST_WORD_CHUNK
            pieces.append(p[:first])
            for i in range(first, len(p), _EST_WORD_CHUNK):
                pieces.append(p[i : i + _EST_WORD_CHUNK])
        else:
            pieces.append(p)
    return pieces


# Long texts are tokenized in chunks. The tokenizers' cost per character varies ~40x with the
# text's shape (~20 ns for prose, ~800 ns for one long run of random letters, measured with
# tiktoken 0.14), tiktoken's o200k pre-tokenizer panics (a BaseException) on a run of ~1M
# spaces, and a prompt that cannot fit a context window should not be tokenized whole. So a text
# longer than CHUNK_CHARS is cut into chunks of CHUNK_CHARS/2..CHUNK_CHARS characters, each cut
# where cl100k, o200k and the estimate all start a new pre-token anyway, which makes the chunk
# counts add up exactly to the whole text's count:
#   * before a space that follows a non-space (no pre-token runs on over a space: " word"
#     and whitespace runs start at it), or
#   * before a punctuation mark that follows a letter or digit ("foo.bar" -> "foo" ".bar";
#     not an apostrophe: o200k keeps "'s" on its word; ASCII and common CJK punctuation).
# A stretch of CHUNK_CHARS/2 characters with neither (a hostile run, not prose or code) is cut
# anyway; only then can a count differ from the whole-text count (by a token or so per cut).
CHUNK_CHARS = 16384
_SPLIT_RE = re.compile(r"(?<=\S) |(?<=[^\W_])[!-&(-/:-@\[-`{-~、。〈〉《》「」『』【】〔〕！（），．：；？]")
# The longest token of cl100k_base and o200k_base, in bytes (checked in tests): a text of N
# characters (>= N bytes) has at least N / MAX_TOKEN_BYTES tokens, a bound that costs nothing.
MAX_TOKEN_BYTES = 128


class Bound(int):
    """A token count that is only a lower bound: counting stopped once it passed its cap."""

    __slots__ = ()


def _chunks(text: str) -> Iterator[str]:
    """Consecutive pieces of ``text`` (see CHUNK_CHARS) whose token counts add up."""
    start, n, size = 0, len(text), CHUNK_CHARS
    while n - start > size:
        m = _SPLIT_RE.search(text, start + size // 2, start + size)
        cut = m.start() if m is not None else start + size
        yield text[start:cut]
        start = cut
    yield text[start:]


def count_tokens_steps(text: str, encoding: str = "o200k_base",
                       cap: int | None = None) -> Generator[int, None, int]:
    """Count the tokens of ``text`` chunk by chunk; a generator that yields the characters of
    each chunk counted (work done: a place for the caller to pause, see
    ``api.validate.paced``) and returns the count (:func:`count_tokens`'s, exact with
    tiktoken). The prompt counters built on it yield the same way.

    With ``cap``, counting stops as soon as the count is known to exceed it and the return
    value is then a :class:`Bound` above ``cap`` (with tiktoken first the free bound
    ``len(text) / MAX_TOKEN_BYTES``, else the exact count of the chunks read so far): a text
    that cannot fit is never tokenized whole."""
    if not text:
        return 0
    enc = get_encoding(encoding)
    if cap is not None and enc is not None:
        floor = -(-len(text) // MAX_TOKEN_BYTES)
        if floor > cap:
            return Bound(floor)
    count = (lambda s: len(enc.encode_ordinary(s))) if enc is not None else (
        lambda s: len(_estimate_pieces(s)))
    total = done = 0
    for chunk in _chunks(text):
        total += count(chunk)
        done += len(chunk)
        yield len(chunk)
        if cap is not None and total > cap and done < len(text):
            return Bound(total)
    return total


def run_steps(steps: Generator[Any, None, _T]) -> _T:
    """Run a stepwise count (:func:`count_tokens_steps` and the prompt counters built on it)
    to its end without pausing; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def split_pieces_counted(text: str, encoding: str = "o200k_base",
                         stop_after: int | None = None) -> tuple[list[str], int]:
    """Split ``text`` into token pieces; return ``(pieces, token_count)``.

    ``"".join(pieces) == text`` always holds, except with ``stop_after``: a long text
    (see CHUNK_CHARS) is then split only until more than ``stop_after`` tokens are known, and
    ``pieces`` are its first ones (exactly the whole text's first pieces), ``token_count``
    theirs (what a caller that keeps ``stop_after`` tokens needs).

    With tiktoken each piece is the text of one token, except where a character
    is split across several tokens (its UTF-8 bytes are not valid on their own,
    e.g. some emoji and CJK): those consecutive tokens are merged into a single
    piece, so such a piece covers more than one token and ``token_count`` (the
    exact ``len(enc.encode_ordinary(text))``) can exceed ``len(pieces)``.

    Without tiktoken the pieces come from :func:`_estimate_pieces` and
    ``token_count == len(pieces)`` is an estimate.
    """
    if not text:
        return [], 0
    if len(text) > CHUNK_CHARS:  # (see CHUNK_CHARS)
        pieces, total = [], 0
        for chunk in _chunks(text):
            p, c = split_pieces_counted(chunk, encoding)
            pieces.extend(p)
            total += c
            if stop_after is not None and total > stop_after:
                break
        return pieces, total
    enc = get_encoding(encoding)
    if enc is None:
        pieces = _estimate_pieces(text)
        return pieces, len(pieces)
    tokens = enc.encode_ordinary(text)
    pieces = []
    buf = b""
    for tb in enc.decode_tokens_bytes(tokens):
        buf += tb
        try:
            s = buf.decode("utf-8")
        except UnicodeDecodeError:
            continue
        pieces.append(s)
        buf = b""
    if buf:  # only reachable for text with lone surrogates
        pieces.append(buf.decode("utf-8", errors="replace"))
    return pieces, len(tokens)


def split_pieces(text: str, encoding: str = "o200k_base") -> list[str]:
    """Pieces of ``text``, one per token (see :func:`split_pieces_counted`)."""
    return split_pieces_counted(text, encoding)[0]


def count_tokens(text: str, encoding: str = "o200k_base") -> int:
    """Number of tokens in ``text``: exact with tiktoken, else an estimate.

    Special-token strings such as ``<|endoftext|>`` are counted as plain text. A text longer
    than CHUNK_CHARS is counted in chunks (:func:`count_tokens_steps`).
    """
    if not text:
        return 0
    n = len(text)
    if n > CHUNK_CHARS:
        return run_steps(count_tokens_steps(text, encoding))
    enc = get_encoding(encoding)
    if n > SHORT_COUNT_CHARS:
        return len(_estimate_pieces(text)) if enc is None else len(enc.encode_ordinary(text))
    # a short text (a role, "Hi", a tool name): counted once per tokenizer (hot path)
    key = (text, encoding if enc is not None else "")
    c = _short_counts.get(key)
    if c is None:
        c = len(_estimate_pieces(text)) if enc is None else len(enc.encode_ordinary(text))
        if len(_short_counts) >= SHORT_COUNT_ENTRIES:
            _short_counts.clear()  # (bounded: cheap to refill)
        _short_counts[key] = c
    return c


SHORT_COUNT_CHARS = 32
"""Texts up to this long are counted once and remembered (:func:`count_tokens`): roles, short
prompts and names recur on every request."""
SHORT_COUNT_ENTRIES = 4096
# (text, encoding name; "" when estimating) -> tokens
_short_counts: dict[tuple[str, str], int] = {}


# ---------------------------------------------------------------------------
# Token-exact synthetic text
# ---------------------------------------------------------------------------

# Every entry is one token in cl100k_base and o200k_base (checked with tiktoken;
# see tests/test_tokens.py).
# fmt: off
WORDS: tuple[str, ...] = (
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " as", " with", " was",
    " on", " be", " by", " this", " are", " from", " at", " or", " an", " have", " not", " but",
    " which", " all", " can", " has", " more", " one", " will", " their", " about", " they",
    " also", " other", " been", " its", " so", " into", " some", " time", " than", " when",
    " there", " only", " may", " new", " these", " many", " would", " any", " most", " first",
    " such", " after", " what", " use", " used", " data", " system", " model", " models", " value",
    " values", " result", " results", " process", " information", " work", " design",
    " development", " research", " study", " method", " methods", " approach", " analysis",
    " based", " support", " service", " services", " application", " applications", " user",
    " users", " network", " number", " level", " set", " part", " important", " different",
    " large", " small", " high", " low", " good", " great", " long", " short", " early", " late",
    " public", " private", " open", " simple", " complex", " clear", " common", " general",
    " specific", " local", " global", " main", " key", " final", " full", " real", " similar",
    " single", " multiple", " major", " minor", " basic", " core", " current", " recent",
    " future", " past", " present", " each", " every", " both", " few", " several", " various",
    " certain", " given", " known", " available", " possible", " necessary", " provide",
    " provides", " provided", " make", " makes", " made", " take", " takes", " taken", " give",
    " gives", " find", " found", " show", " shows", " shown", " include", " includes",
    " including", " allow", " allows", " create", " creates", " created", " build", " help",
    " helps", " need", " needs", " want", " keep", " run", " runs", " running", " start",
    " starts", " end", " ends", " change", " changes", " follow", " following", " report",
    " reports", " test", " tests", " testing", " check", " control", " access", " state",
    " states", " times", " day", " days", " year", " years", " way", " ways", " point", " points",
    " case", " cases", " group", " groups", " form", " forms", " type", " types", " order",
    " line", " lines", " table", " file", " files", " page", " pages", " code", " source",
    " request", " response", " server", " client", " text", " message", " messages", " token",
    " tokens", " input", " output", " function", " functions", " object", " objects", " structure",
    " structures", " pattern", " patterns", " feature", " features", " option", " options",
    " task", " tasks", " goal", " goals", " problem", " problems", " solution", " solutions",
    " question", " questions", " answer", " answers", " idea", " ideas", " example", " examples",
    " step", " steps", " stage", " phase", " rate", " rates", " cost", " costs", " price",
    " power", " energy", " water", " light", " sound", " color", " world", " country", " city",
    " area", " region", " space", " place", " field", " market", " company", " business", " team",
    " people", " person", " family", " community", " government", " policy", " law", " rule",
    " rules", " history", " story", " science", " theory", " practice", " experience",
    " knowledge", " learning", " training", " education", " health", " care", " quality",
    " performance", " security", " safety", " risk", " management", " product", " products",
    " resource", " resources", " tool", " tools", " technology", " software", " hardware",
    " computer", " memory", " storage", " internet", " web", " online", " digital", " image",
    " images", " video", " signal", " signals", " layer", " layers", " between", " within",
    " without", " through", " across", " during", " before", " under", " over", " above", " below",
    " around", " while", " where", " because", " however", " although", " therefore", " thus",
    " then", " still", " just", " very", " well", " even", " often", " usually", " always",
    " never", " sometimes", " quickly", " slowly", " directly", " simply", " really", " actually",
    " should", " could", " might", " must", " shall", " we", " you", " he", " she", " our",
    " your", " them", " us", " his", " her", " old", " same", " own", " another", " next", " last",
    " second", " third", " increase", " decrease", " improve", " reduce", " maintain", " manage",
    " define", " describe", " explain", " consider", " require", " requires", " required",
    " produce", " generate", " generated", " compare", " measure", " estimate", " predict",
    " evaluate", " observe", " apply", " applied", " implement", " implemented", " deploy",
    " update", " review", " select", " supported", " enable", " enabled", " ensure", " return",
    " returns", " receive", " send", " sent", " store", " load", " read", " write", " written",
    " close", " closed", " move", " moved", " turn", " call", " called", " name", " named",
    " standard", " strong", " weak", " fast", " slow", " free", " fixed", " random", " stable",
    " dynamic", " static", " active", " natural", " human", " social", " economic", " political",
    " physical", " chemical", " biological", " environmental", " mean", " means", " average",
    " total", " overall", " limit", " limits", " range", " scale", " size", " length", " weight",
    " height",
)

# Sentence openers for the first sentence of a text (no leading space).
FIRST_WORDS: tuple[str, ...] = (
    "The", "This", "In", "It", "We", "These", "For", "A", "An", "As", "When", "However", "Each",
    "Our", "Many", "Most", "Some", "Such", "Another", "Every", "All", "One", "There", "They",
    "While", "After", "Since", "Here", "Then", "Thus", "Overall", "Finally", "Both", "Other",
    "New",
)
# fmt: on

# Sentence openers after a ".": the same words with a leading space.
CAP_WORDS: tuple[str, ...] = tuple(" " + w for w in FIRST_WORDS)

PUNCT: tuple[str, ...] = (",", ".")

_COMMA_PROB = 0.1
_WORD_INDEX = {w: i for i, w in enumerate(WORDS)}
_OPENERS = 35  # FIRST_WORDS and CAP_WORDS (lorem_pieces draws an index below this, 6 bits)
assert len(FIRST_WORDS) == len(CAP_WORDS) == _OPENERS


def lorem_pieces(n: int, rng: random.Random) -> list[str]:
    """Return exactly ``n`` pieces of sentence-like filler text.

    Each piece is one token in both cl100k_base and o200k_base, and so is the
    concatenation: ``len(enc.encode("".join(lorem_pieces(n, rng)))) == n``.
    The text starts with a :data:`FIRST_WORDS` entry; sentences are 6-18 tokens
    long (opener, words from :data:`WORDS`, occasional ``","``, final ``"."``);
    later sentences start with a :data:`CAP_WORDS` entry. The output simply stops
    when ``n`` pieces have been produced, possibly mid-sentence.

    The text is a window of :data:`LOREM_CORPUS` pieces (a fixed text of such sentences,
    read as a ring) starting at a sentence the RNG picks with one draw: the same RNG
    state gives the same text, a shorter answer is a prefix of a longer one, and the cost
    is a slice (a per-piece draw cost ~0.3 µs a token on every answer; issue 15).
    """
    if n <= 0:
        return []
    corpus, starts = lorem_ring()
    at = starts[int(rng.random() * len(starts))]
    out = corpus[at:at + n]
    while len(out) < n:  # past the end: the ring goes on from its first sentence
        out += corpus[:n - len(out)]
    out[0] = _FIRST_OF[out[0]]  # a text's first sentence has no leading space
    return out


LOREM_CORPUS = 1 << 16
"""Pieces in the ring :func:`lorem_pieces` reads (~5,400 sentences; 512 KiB of references to
the shared word strings; built once per process, on first use, ~20 ms)."""
_FIRST_OF = dict(zip(CAP_WORDS, FIRST_WORDS, strict=True))
_corpus: tuple[list[str], list[int]] | None = None


def lorem_ring() -> tuple[list[str], list[int]]:
    """The ring of :func:`lorem_pieces` and the index of each of its sentences' first piece
    (whole sentences, each opened by a :data:`CAP_WORDS` entry, from a fixed seed)."""
    global _corpus
    if _corpus is None:
        # (whole sentences: the ring's seam is a sentence boundary like any other)
        pieces = _lorem_sentences(LOREM_CORPUS, random.Random(0x10AE))
        starts = [i for i, p in enumerate(pieces) if i == 0 or pieces[i - 1] == "."]
        _corpus = (pieces, starts)
    return _corpus


def _lorem_sentences(n: int, rng: random.Random) -> list[str]:
    """At least ``n`` pieces of whole sentences, each opened by a :data:`CAP_WORDS` entry."""
    # The draws are those of ``randint(6, 18)``, ``choices(WORDS, k=length - 2)``,
    # ``random()``, ``randint(1, length - 4)`` and ``choice(...)`` per sentence, inlined as
    # CPython's ``random`` module makes them. An adjacent repeat (the same string object) is
    # replaced by the next word.
    out: list[str] = []
    rand = rng.random
    bits = rng.getrandbits
    words = WORDS
    nwords = len(words)
    fwords = float(nwords)
    append = out.append
    while len(out) < n:
        r = bits(4)  # randint(6, 18): 6 + _randbelow(13)
        while r >= 13:
            r = bits(4)
        length = 6 + r
        body = [words[int(rand() * fwords)] for _ in range(length - 2)]
        if any(map(is_, body, body[1:])):  # (rare: a word drawn twice in a row)
            for i in range(1, length - 2):
                if body[i] is body[i - 1]:
                    body[i] = words[(_WORD_INDEX[body[i]] + 1) % nwords]
        if rand() < _COMMA_PROB * (length - 4):
            # a comma after the opener's first word at the earliest, never last
            m = length - 4  # randint(1, m): 1 + _randbelow(m)
            k = m.bit_length()
            r = bits(k)
            while r >= m:
                r = bits(k)
            body[1 + r] = ","
        r = bits(6)  # choice() of an opener: _randbelow(_OPENERS)
        while r >= _OPENERS:
            r = bits(6)
        append(CAP_WORDS[r])
        out.extend(body)
        append(".")
    return out


def choice_first(rng: random.Random) -> str:
    return rng.choice(FIRST_WORDS)


SEQUENCE_SEPARATOR = ","
_SEQ_MAX = 999


def sequence_pieces(n: int, start: int = 0) -> list[str]:
    """Return ``n`` pieces of the counting stream ``"1", ",", "2", ",", "3", ...``.

    Joined: ``"1,2,3,...,998,999,1,2,..."`` -- numbers run 1..999 then wrap to 1,
    separated by a bare ``","`` (no space). ``start`` is an offset into the piece
    stream, so ``sequence_pieces(a) + sequence_pieces(b, start=a) ==
    sequence_pieces(a + b)``; an odd ``start`` begins with ``","``.

    Every piece, and the whole join, is one token per piece in both cl100k_base
    and o200k_base: digit runs of <= 3 are single tokens, and a bare comma keeps
    numbers apart (with ``", "`` the space would become a token of its own in both
    encodings, and ``" 5"`` is split into ``" "`` + ``"5"`` by cl100k).
    """
    out: list[str] = []
    for i in range(start, start + n):
        if i % 2:
            out.append(SEQUENCE_SEPARATOR)
        else:
            out.append(str((i // 2) % _SEQ_MAX + 1))
    return out
