"""A byte-level BPE of our own, written as the tiktoken.model deltaserve reads.

Ranks 0..255 are the single bytes in order, then one rank per learned merge
(most frequent adjacent pair first), over pieces split by Kimi's
pre-tokenization pattern (the pattern deltaserve applies when a model directory
has no tokenization_kimi.py). Kimi's 256 reserved special tokens follow the
ranks, so the model's vocab_size is at least ranks + 256.
"""

import base64
import collections
import json
import os
import sys

import regex
import tiktoken

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from make_tokenizer_fixture import KIMI_PAT_STR  # noqa: E402

NUM_RESERVED_SPECIAL = 256


def train_ranks(text, num_ranks):
    counts = collections.Counter(regex.findall(KIMI_PAT_STR, text, flags=regex.VERSION1))
    words = {tuple(bytes([b]) for b in piece.encode()): n for piece, n in counts.items()}
    ranks = {bytes([b]): b for b in range(256)}
    while len(ranks) < num_ranks:
        pairs = collections.Counter()
        for word, n in words.items():
            for a, b in zip(word, word[1:]):
                pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        ranks[a + b] = len(ranks)
        merged = {}
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return ranks


def write(model_dir, ranks):
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "tiktoken.model"), "w") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    n = len(ranks)
    specials = {n: "[BOS]", n + 1: "[EOS]"}
    config = {
        "added_tokens_decoder": {
            str(i): {"content": text, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, text in specials.items()
        },
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
    }
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def load(model_dir):
    ranks = {}
    with open(os.path.join(model_dir, "tiktoken.model")) as f:
        for line in f:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(name="deltaserve-demo", pat_str=KIMI_PAT_STR,
                             mergeable_ranks=ranks, special_tokens={})
