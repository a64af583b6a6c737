"""Batches with deferred JPEGs finished (`gpu_decode.finish_batch`: nvJPEG, the copy to the device) on a background
thread, up to `AHEAD` batches before the step that takes them.

Why: nvJPEG's batched decode holds the calling thread ~57 us per image (Huffman decoding on the CPU, the decoder's
lock, its stream syncs): 14.6 ms per 256-image batch at 224 px on an H100 (2026-11-27-h100-shards: JPEG shards
80 % of the bare model, PNG shards 92 %). In the training thread that time is added to every step; here it runs
while the training thread launches the step (the device runs both: decoding is a small part of its time).
Measured with this thread (2026-11-27-h100-jpeg-ahead): 88 % of the bare model on the H100, 89 % on an H200.

Streams: the thread finishes each batch with its own stream S current (the decoder orders its nvJPEG stream
against S as it did against the training stream), records an event on S, and hands the batch over; the consumer
makes its current stream T wait for that event and marks the batch's images used by T (`record_stream`), so S's
allocator reuses their memory only once T is done with them. Batches keep their order; an error in the loader or
in finishing a batch is raised in the consumer, at the batch where it happened.
"""

from __future__ import annotations

import queue
import threading
from typing import Iterator

import torch

from eigtrain.data.decode import DecodeSpec
from eigtrain.data.gpu_decode import JpegDecoder, finish_batch

AHEAD = 2  # batches finished before they are taken: one being taken, one ready, the next being decoded
_END = object()


def finished_ahead(batches: Iterator[dict], spec: DecodeSpec, device: torch.device) -> Iterator[dict]:
    """`finish_batch` of each of `batches`, in order, computed on a background thread up to `AHEAD` ahead."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    side = torch.cuda.Stream(device) if cuda else None
    ready: queue.Queue = queue.Queue(maxsize=AHEAD)
    stop = threading.Event()

    def hand(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            decoder = JpegDecoder(device)
            for batch in batches:
                item: tuple[dict, torch.cuda.Event | None]
                if side is None:
                    item = (finish_batch(batch, spec, device, decoder), None)
                else:
                    with torch.cuda.stream(side):
                        batch = finish_batch(batch, spec, device, decoder)
                        done = torch.cuda.Event()
                        done.record(side)
                    item = (batch, done)
                if not hand(item):
                    return
            hand((_END, None))
        except BaseException as exn:  # raised again in the consumer, at this batch
            hand((exn, None))

    threading.Thread(target=work, daemon=True, name="jpeg-decode-ahead").start()
    try:
        while True:
            batch, done = ready.get()
            if batch is _END:
                return
            if isinstance(batch, BaseException):
                raise batch
            if done is not None:
                consumer = torch.cuda.current_stream(device)
                consumer.wait_event(done)
                batch["image"].record_stream(consumer)
            yield batch
    finally:
        stop.set()  # the thread stops at its next hand-over; the loader's workers end with it
