"""CLIP's byte-level BPE tokenizer: the same ids as open_clip's ``SimpleTokenizer``, no download.

The vocabulary ``bpe_simple_vocab_16e6.txt.gz`` beside this file is data from OpenAI's CLIP repository
(https://github.com/openai/CLIP, MIT License, Copyright (c) 2021 OpenAI), the same file open_clip ships.
Its first line is a header; the next 48,894 lines are BPE merges in priority order. The vocabulary is
256 byte symbols, the same 256 with an end-of-word mark, one symbol per merge, then the start- and
end-of-text tokens: 49,408 ids.

Text is cleaned as open_clip's default ``lower`` cleaning: ftfy repair, HTML unescape (twice), runs
of whitespace collapsed to one space, lower case.
"""

from __future__ import annotations

import gzip
import html
from functools import lru_cache
from pathlib import Path

import torch

try:  # open_clip's pre-tokenisation needs Unicode classes (\p{L}, \p{N}): the `regex` package
    import regex as _re
except ImportError:  # pragma: no cover - regex is a declared dependency
    _re = None

VOCAB_FILE = Path(__file__).with_name("bpe_simple_vocab_16e6.txt.gz")
NUM_MERGES = 49152 - 256 - 2  # merges used (open_clip / OpenAI CLIP use this many lines)
SOT, EOT = "<start_of_text>", "<end_of_text>"
CONTEXT_LENGTH = 77


@lru_cache
def byte_symbols() -> list[str]:
    """A printable unicode character for each of the 256 bytes (GPT-2's reversible byte mapping):
    printable latin-1 bytes map to themselves, the rest to code points 256, 257, ... in byte order."""
    keep = (
        set(range(ord("!"), ord("~") + 1))
        | set(range(ord("¡"), ord("¬") + 1))
        | set(range(ord("®"), ord("ÿ") + 1))
    )
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def _vocab_order() -> list[str]:
    """Base symbols in the vocabulary's order: the printable bytes first (ascending), then the others."""
    sym = byte_symbols()
    printable = [b for b in range(256) if ord(sym[b]) == b]
    others = [b for b in range(256) if ord(sym[b]) != b]
    return [sym[b] for b in printable + others]


def clean_text(text: str) -> str:
    """open_clip's default cleaning: ftfy + HTML unescape, collapse whitespace, lower case."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:  # pragma: no cover - ftfy is a declared dependency
        pass
    text = html.unescape(html.unescape(text)).strip()
    return " ".join(text.split()).lower()


class CLIPTokenizer:
    """``tokenizer(texts) -> LongTensor (N, context_length)``: start token, BPE ids, end token,
    zero padding; longer texts are cut to ``context_length`` with the end token last."""

    def __init__(self, vocab_file: str | Path = VOCAB_FILE, context_length: int = CONTEXT_LENGTH):
        if _re is None:
            raise ImportError("the CLIP tokenizer needs the `regex` package: pip install regex")
        with gzip.open(vocab_file, "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")[1 : NUM_MERGES + 1]
        merges = [tuple(line.split()) for line in lines]
        base = _vocab_order()
        vocab = base + [s + "</w>" for s in base] + ["".join(m) for m in merges] + [SOT, EOT]
        self.encoder = {s: i for i, s in enumerate(vocab)}
        self.decoder = dict(enumerate(vocab))
        self.merge_rank = {m: i for i, m in enumerate(merges)}
        self.sot_token_id, self.eot_token_id = self.encoder[SOT], self.encoder[EOT]
        self.vocab_size = len(vocab)
        self.vocab_file = Path(vocab_file)
        self.context_length = context_length
        self._byte_sym = byte_symbols()
        self._sym_byte = {s: b for b, s in enumerate(self._byte_sym)}
        self._pattern = _re.compile(
            rf"{SOT}|{EOT}|'s|'t|'re|'ve|'m|'ll|'d|[\p{{L}}]+|[\p{{N}}]|[^\s\p{{L}}\p{{N}}]+", _re.IGNORECASE
        )
        self._cache: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ BPE
    def _merge_word(self, word: str) -> list[str]:
        """Apply the merges to one pre-token (already mapped to byte symbols), lowest rank first."""
        parts = list(word[:-1]) + [word[-1] + "</w>"]
        while len(parts) > 1:
            ranks = [self.merge_rank.get((a, b)) for a, b in zip(parts, parts[1:])]
            best = min((r for r in ranks if r is not None), default=None)
            if best is None:
                break
            pair = next(p for p, r in zip(zip(parts, parts[1:]), ranks) if r == best)
            merged, i = [], 0
            while i < len(parts):  # merge every occurrence of the pair, left to right
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == pair:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def _token_ids(self, piece: str) -> list[int]:
        ids = self._cache.get(piece)
        if ids is None:
            if piece in (SOT, EOT):
                ids = [self.encoder[piece]]
            else:
                word = "".join(self._byte_sym[b] for b in piece.encode("utf-8"))
                ids = [self.encoder[s] for s in self._merge_word(word)]
            if len(self._cache) < 100_000:
                self._cache[piece] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """Cleaned text -> BPE ids (no start / end tokens)."""
        out: list[int] = []
        for piece in self._pattern.findall(clean_text(text)):
            out.extend(self._token_ids(piece))
        return out

    def decode(self, ids) -> str:
        """BPE ids -> text (end-of-word marks become spaces; special tokens are kept as text)."""
        text = "".join(self.decoder[int(i)] for i in ids)
        specials = (SOT, EOT)
        out, buf = [], bytearray()
        i = 0
        while i < len(text):
            sp = next((s for s in specials if text.startswith(s, i)), None)
            if sp is not None:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                out.append(sp)
                i += len(sp)
            elif text.startswith("</w>", i):
                buf.extend(b" ")
                i += 4
            else:
                buf.append(self._sym_byte[text[i]])
                i += 1
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def __call__(self, texts: str | list[str], context_length: int | None = None) -> torch.Tensor:
        if isinstance(texts, str):
            texts = [texts]
        n = context_length or self.context_length
        result = torch.zeros(len(texts), n, dtype=torch.long)
        for row, text in enumerate(texts):
            ids = [self.sot_token_id, *self.encode(text), self.eot_token_id]
            if len(ids) > n:
                ids = ids[:n]
                ids[-1] = self.eot_token_id
            result[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return result


    # ------------------------------------------------------------------ for a server
    def describe(self) -> dict:
        """The settings a server needs to give the same ids (an export's ``export.json``)."""
        return {
            "kind": "clip_bpe",
            "reference": "open_clip SimpleTokenizer with its default 'lower' cleaning (same ids)",
            "vocab_size": int(self.vocab_size),
            "bpe_merges": int(NUM_MERGES),
            "context_length": int(self.context_length),
            "sot_token_id": int(self.sot_token_id),
            "eot_token_id": int(self.eot_token_id),
            "pad_token_id": 0,
            "truncate": "cut to context_length; the last id becomes eot_token_id",
            "lower_case": True,
            "clean": ["ftfy.fix_text", "html.unescape twice", "collapse whitespace runs to one space", "strip"],
            "pretokenize_regex": self._pattern.pattern,
        }

    def files(self) -> dict[str, Path]:
        """The vocabulary (BPE merges), which a server reads beside :meth:`describe`."""
        return {"vocab_file": self.vocab_file}


@lru_cache(maxsize=4)
def _cached(context_length: int) -> CLIPTokenizer:
    return CLIPTokenizer(context_length=context_length)


def create_tokenizer(context_length: int | None = None) -> CLIPTokenizer:
    """The CLIP family's tokenizer (its ``FamilySpec.tokenizer``): open_clip's BPE with
    ``context_length`` tokens per text (None: 77), built once per length and cached (2 s to build)."""
    return _cached(int(context_length or CONTEXT_LENGTH))


__all__ = ["CLIPTokenizer", "clean_text", "create_tokenizer"]
