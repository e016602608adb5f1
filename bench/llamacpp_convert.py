#!/usr/bin/env python3
"""Runs llama.cpp's convert_hf_to_gguf.py on a model that has no tokenizer
(hpd-mkmodel's random models): every model class writes tokenizer model
"none" with the config's vocab_size instead of reading a tokenizer, which
llama.cpp loads as that many dummy tokens (llama-bench draws random ids).

    python3 bench/llamacpp_convert.py LLAMA_CPP_DIR MODEL_DIR --outfile F --outtype bf16
"""
import os
import runpy
import sys


def main():
    llama = sys.argv[1]
    script = os.path.join(llama, "convert_hf_to_gguf.py")
    sys.argv = [script] + sys.argv[2:]
    sys.path.insert(0, llama)
    sys.path.insert(1, os.path.join(llama, "gguf-py"))
    import conversion

    def no_vocab(self):
        self.gguf_writer.add_tokenizer_model("none")
        self.gguf_writer.add_vocab_size(self.hparams["vocab_size"])

    todo = [conversion.ModelBase]
    while todo:
        cls = todo.pop()
        if "set_vocab" in cls.__dict__:
            cls.set_vocab = no_vocab
        todo.extend(cls.__subclasses__())
    conversion.ModelBase.set_vocab = no_vocab
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
