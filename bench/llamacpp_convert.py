#!/usr/bin/env python3
"""Runs llama.cpp's own HF-to-GGUF converter on a deltaserve checkpoint.

    python bench/llamacpp_convert.py LLAMA_CPP_SRC MODEL_DIR --outfile OUT.gguf --outtype bf16

LLAMA_CPP_SRC is llama.cpp's source tree (from the llama-cpp-python sdist,
vendor/llama.cpp); every other argument goes to its convert_hf_to_gguf.py
unchanged. Used by bench/llamacpp_compare.sh; nothing of llama.cpp lives here.

One change to the converter, made at run time: checkpoints with the 256-byte
vocabulary (deltaserve's presets and golden models) ship no tokenizer files,
and the Kimi converters' set_vocab needs a TikToken tokenizer. For such a
model the GGUF gets `tokenizer.ggml.model = "none"` (the converter's own
_set_vocab_none) and `<arch>.vocab_size` (which the Kimi converters write
anyway): llama.cpp then makes `vocab_size` dummy tokens, no BOS/EOS, and
token ids go in unchanged, as they do into deltaserve.
"""

import sys
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "tokenizer_config.json")


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src = Path(sys.argv[1]).resolve()
    model_dir = Path(sys.argv[2])
    if not (src / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"llamacpp_convert: no convert_hf_to_gguf.py in {src}")
    sys.path[:0] = [str(src / "gguf-py"), str(src)]
    sys.argv = [str(src / "convert_hf_to_gguf.py")] + sys.argv[2:]

    import convert_hf_to_gguf
    from conversion.kimi_k3 import KimiK3Model
    from conversion.kimi_linear import KimiLinearModel

    if not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        print(f"llamacpp_convert: {model_dir} has no tokenizer files: writing tokenizer.ggml.model "
              "= none (token ids map 1:1)", file=sys.stderr)

        def set_vocab_none(self):
            self._set_vocab_none()

        KimiK3Model.set_vocab = set_vocab_none
        KimiLinearModel.set_vocab = set_vocab_none

    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
