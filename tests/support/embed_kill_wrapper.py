"""Runs eigtrain-embed and SIGKILLs this process as its third chunk is being written (its temporary file written,
not yet renamed): a real kill mid-way. A script, not a test module: tests/export/test_embed_corpus.py runs it."""

import os
import signal
import sys

from safetensors.torch import save_file

import eigtrain.export.corpus as embed_corpus

original, calls = embed_corpus.write_chunk, [0]


def write_chunk(out, rank, index, keys, features, spec):
    calls[0] += 1
    if calls[0] == 3:
        save_file({"features": features.contiguous()}, str(out / f".rank-{rank}-chunk-{index:05d}.safetensors.tmp"))
        os.kill(os.getpid(), signal.SIGKILL)
    return original(out, rank, index, keys, features, spec)


embed_corpus.write_chunk = write_chunk
sys.exit(embed_corpus.main(sys.argv[1:]))
