#!/usr/bin/env python3
"""Writes the tokenizer test fixture, tests/data/tokenizer/, with the real tiktoken.

The fixture is a small Kimi-style tokenizer directory plus tiktoken's own
encodings of a set of test strings, so tests/runtime/tokenizer/tokenizer_test.cc
can check the C++ tokenizer against tiktoken without needing Python:

  tiktoken.model          `<base64 of token bytes> <rank>` lines: all 256 bytes
                          (in a shuffled rank order, so no code may assume
                          rank == byte) and a few hundred merges learned here
  tokenizer_config.json   added_tokens_decoder for a few of the 256 reserved
                          special ids that follow the BPE ranks, eos_token
  expected.json           for every test string: encode_ordinary(text) and
                          encode(text, allowed_special="all")

Usage (needs `pip install tiktoken`; the output is deterministic):
  python3 tools/make_tokenizer_fixture.py [--out tests/data/tokenizer]
"""

import argparse
import base64
import collections
import json
import os
import random

import regex
import tiktoken

# The pre-tokenization pattern of Kimi K2 / Kimi Linear / K3, as
# tokenization_kimi.py builds it (runtime/tokenizer/pretokenize.cc carries the
# same pieces).
KIMI_PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

NUM_RESERVED_SPECIAL = 256
NUM_MERGES = 420

# Training text: varied enough that the merges include whole words, words with
# a leading space, contractions, digit groups, partial UTF-8 sequences (the
# first two bytes of a CJK character), whitespace runs and newlines.
TRAINING_TEXT = """
The quick brown fox jumps over the lazy dog. The dog doesn't mind; it's lazy.
I'M SURE WE'LL BE FINE, AND THEY'VE SAID SO. You're right, she'd know, I'd say.
Numbers: 12345, 67890, 3.14159, 2024-06-01, 1000000 and 42 and 7.
Hello world! Hello, World! hello there, general Kenobi.
你好世界。你好，世界！中文English混合。我们的世界很大，你好吗？
Café, naïve, résumé, Ångström, façade, jalapeño, über, Straße, coöperate.
Привет мир! Как дела? Ελληνικά γράμματα. こんにちは世界。안녕하세요 세계.
Emoji: 👋 🎉 🚀 😀😀😀 ❤️ 👍🏽
    indented code:
        def f(x):
            return x ** 2  # square it


Tabs\tand\ttabs\t\there.   Spaces    everywhere   .
Windows line\r\nendings\r\n and trailing spaces   \n\n\n
"""


def pieces_of(text):
    # The trainer only needs a reasonable split; `regex` in VERSION1 mode
    # understands the pattern's class intersections.
    return regex.findall(KIMI_PAT_STR, text, flags=regex.VERSION1)


def train_ranks():
    """256 single bytes in a shuffled order, then NUM_MERGES learned merges."""
    byte_order = list(range(256))
    random.Random(20240601).shuffle(byte_order)
    ranks = {bytes([b]): rank for rank, b in enumerate(byte_order)}

    counts = collections.Counter(p.encode("utf-8") for p in pieces_of(TRAINING_TEXT))
    words = {piece: [bytes([b]) for b in piece] for piece in counts}
    for _ in range(NUM_MERGES):
        pair_counts = collections.Counter()
        for piece, parts in words.items():
            for a, b in zip(parts, parts[1:]):
                pair_counts[(a, b)] += counts[piece]
        if not pair_counts:
            break
        # Most frequent pair; ties broken by the pair's bytes for determinism.
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))
        merged = best[0] + best[1]
        if merged in ranks:
            raise SystemExit(f"merge {merged!r} learned twice")
        ranks[merged] = len(ranks)
        for piece, parts in words.items():
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            words[piece] = out
    return ranks


def special_tokens(num_base):
    named = {
        num_base + 0: "[BOS]",
        num_base + 1: "[EOS]",
        num_base + 2: "<|im_end|>",
        num_base + 3: "<|im_user|>",
        num_base + 4: "<|im_assistant|>",
        num_base + 7: "<|im_middle|>",
        num_base + 20: "<|media_pad|>",
    }
    all_specials = {
        named.get(i, f"<|reserved_token_{i}|>"): i
        for i in range(num_base, num_base + NUM_RESERVED_SPECIAL)
    }
    return named, all_specials


def test_strings(num_base):
    reserved = f"<|reserved_token_{num_base + 100}|>"
    return [
        "",
        "Hello world",
        "Hello, World! hello there.",
        "The quick brown fox jumps over the lazy dog.",
        "I don't know. I'M SURE we'll, they've, you're, she'd, it's.",
        "DON'T STOP 'S 'T 'RE",
        "it'ſ a long s",
        "12345 67890 3.14159 1000000",
        "١٢٣ ½ Ⅻ ²³",
        "你好世界",
        "中文English混合",
        "北京市 Pascal 汉字abc",
        "Café naïve résumé Ångström façade Straße",
        "e\u0301 combining and ǅungla titlecase",
        "Привет мир! Ελληνικά γράμματα.",
        "こんにちは世界 안녕하세요",
        "Emoji: 👋 🎉 🚀 😀😀😀 ❤️ 👍🏽",
        "a   b    c",
        "   leading spaces",
        "trailing spaces   ",
        "\t\ttabs\tand\ttabs",
        "line1\nline2\r\n\r\n\nline3\n",
        "  \n  \n   x",
        "nbsp\u00a0and\u3000ideographic\u2028separator",
        "def f(x):\n    return x ** 2  # square\n\n",
        "Punctuation!!! ... ??? --- ((brackets)) [x] {y}",
        "<|im_end|>",
        "[BOS]Hello[EOS]",
        "user: hi<|im_end|>\n<|im_assistant|>hello<|im_middle|>",
        f"reserved {reserved} token",
        "almost special: <|im_end| and [BOS",
        "<|im_end|><|im_end|>[EOS]",
        " " * 300 + "x",
        "a" * 500,
        ("Hello 你好 world 12345! " * 40).strip(),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--out", default=os.path.join(repo, "tests", "data", "tokenizer"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    ranks = train_ranks()
    num_base = len(ranks)
    named, specials = special_tokens(num_base)

    with open(os.path.join(args.out, "tiktoken.model"), "w", encoding="ascii") as f:
        for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
            f.write(f"{base64.b64encode(token).decode('ascii')} {rank}\n")

    config = {
        "added_tokens_decoder": {
            str(i): {"content": text, "lstrip": False, "normalized": False,
                     "rstrip": False, "single_word": False, "special": True}
            for i, text in sorted(named.items())
        },
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
    }
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")

    enc = tiktoken.Encoding(name="deltaserve-fixture", pat_str=KIMI_PAT_STR,
                            mergeable_ranks=ranks, special_tokens=specials)
    cases = []
    for text in test_strings(num_base):
        ordinary = enc.encode_ordinary(text)
        special = enc.encode(text, allowed_special="all")
        assert enc.decode_bytes(ordinary) == text.encode("utf-8")
        cases.append({"text": text, "ordinary": ordinary, "special": special})
    expected = {
        "tiktoken_version": tiktoken.__version__,
        "num_base_tokens": num_base,
        "num_reserved_special_tokens": NUM_RESERVED_SPECIAL,
        "end_ids": [specials["[EOS]"], specials["<|im_end|>"]],
        "cases": cases,
    }
    with open(os.path.join(args.out, "expected.json"), "w", encoding="ascii") as f:
        json.dump(expected, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"{args.out}: {num_base} BPE ranks, {len(cases)} cases")


if __name__ == "__main__":
    main()
