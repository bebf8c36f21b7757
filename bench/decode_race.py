"""Does a batched JPEG decode on the GPU overwrite memory that queued kernels still read?

torchvision's `decode_jpeg(device="cuda")` takes its images' memory from PyTorch's caching
allocator on the caller's stream, then nvJPEG writes them from a stream of its own that does not
wait for the caller's (pytorch/vision#9606). The allocator hands out a block as soon as it is
freed on its stream, so a block whose readers are still queued there can be written under them.
`expctl.builtin.datasets.gpuimages.decode` waits for the caller's stream first. Each round here:
fill tensors of the decoded images' size and wait; queue a long kernel, then one sum per tensor;
free the tensors (their sums still queued); decode a batch; compare the sums with the values
written. Printed: rounds with a wrong sum, for torchvision's call as it is and for expctl's.

    python bench/decode_race.py          # on a CUDA machine; exit 1 if expctl's decode corrupts
"""

from __future__ import annotations

import sys

import torch
from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg

from expctl.builtin.datasets.gpuimages import decode


def rounds(fn, files: list[torch.Tensor], n: int, device: torch.device) -> int:  # type: ignore[no-untyped-def]
    stream = torch.cuda.Stream(device)  # as the feeding thread's
    wrong = 0
    with torch.cuda.stream(stream):
        a = torch.randn(2048, 2048, device=device)
        for r in range(n):
            filled = [
                torch.full((3, 512, 512), (r + i) % 251, dtype=torch.uint8, device=device)
                for i in range(len(files))
            ]
            stream.synchronize()
            for _ in range(40):  # a few ms of work queued before the sums
                a = (a @ a).tanh_()
            sums = torch.stack([t.sum(dtype=torch.int64) for t in filled])
            del filled  # freed on this stream while their sums are still queued
            fn(files)
            stream.synchronize()
            want = torch.tensor(
                [((r + i) % 251) * 3 * 512 * 512 for i in range(len(files))], device=device
            )
            wrong += int(not torch.equal(sums, want))
    return wrong


def main() -> int:
    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    files = [encode_jpeg((torch.rand(3, 512, 512) * 255).to(torch.uint8)) for _ in range(32)]
    n = 50
    raw = rounds(lambda f: decode_jpeg(f, mode=ImageReadMode.RGB, device=device), files, n, device)
    ours = rounds(lambda f: decode(f, device, "gpu", 3), files, n, device)
    print(
        f"rounds with a wrong sum, of {n}: torchvision's decode_jpeg {raw}, expctl's decode {ours}"
    )
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main())
