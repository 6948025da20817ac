"""The training text: the King James Version of the Bible, from Debian's bible-kjv-text.

The KJV (1611) is in the public domain (in the United Kingdom the Crown's
letters patent still restrict printing it); Debian ships it in the
`bible-kjv-text` package, read here through `bible` from `bible-kjv`
(`apt-get install bible-kjv`). Each chapter becomes one paragraph of verses,
a verse to a line, without verse numbers; chapters are separated by a blank line.
Every 25th chapter (1,189 in all, so 48) is held out from training.
"""

import re
import subprocess

VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
HELD_OUT_EVERY = 25


def chapters():
    """[(book, chapter, [verse texts])] in canonical order."""
    text = subprocess.run(["bible", "-f", "-l", "1000000", "gen1:1-rev22:21"],
                          check=True, capture_output=True, text=True).stdout
    out = []
    for line in text.splitlines():
        m = VERSE.match(line)
        if not m:
            if line.strip():
                raise ValueError(f"unexpected line from bible: {line!r}")
            continue
        book, chapter, _, verse = m.groups()
        if not out or out[-1][0] != book or out[-1][1] != int(chapter):
            out.append((book, int(chapter), []))
        out[-1][2].append(verse.strip())
    return out


def split():
    """(training text, held-out text): chapter paragraphs joined by blank lines."""
    train, held = [], []
    for i, (_, _, verses) in enumerate(chapters()):
        (held if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else train).append("\n".join(verses))
    return "\n\n".join(train) + "\n", "\n\n".join(held) + "\n"


if __name__ == "__main__":
    import sys
    t, h = split()
    print(len(chapters()), "chapters;", len(t), "training bytes;", len(h), "held-out bytes")
    if len(sys.argv) > 1:  # a path for the held-out text
        with open(sys.argv[1], "w") as f:
            f.write(h)
