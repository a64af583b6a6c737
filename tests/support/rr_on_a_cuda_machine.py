"""eigtrain-rr as on a machine where CUDA is visible: torch.cuda.is_available() answers True, and the job, which reads
embedding files on the CPU, must still take gloo (NCCL failed on its CPU tensors). Run as a script under torchrun."""

import sys

import torch

torch.cuda.is_available = lambda: True

from eigtrain.export.command import main  # noqa: E402  (after the patch, as on the GPU machine)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
