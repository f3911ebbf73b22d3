"""Which GPU this machine has, for the prepared device run (``run_device.sh``).

``python -m charon_search.profiling.device [--expect KEY]`` checks that torch sees a CUDA GPU
(a CUDA build, compute capability 9.0 or newer), maps the device's exact name to its
profile-DB key and prints ``GPU_KEY=<key>`` on stdout (the details on stderr). Exit 2 on a
device that is not one of ``DEVICE_KEYS`` or not ``--expect``, 3 without a usable CUDA torch.
Only exact names are accepted: an H100 PCIe / NVL or an H200 NVL (lower power limits) must
not be filed under the SXM keys, and an H100 never under the H200's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from charon_search.errors import ConfigError

__all__ = ["DEVICE_KEYS", "gpu_key_for_device", "main"]

#: ``torch.cuda.get_device_name`` -> profile-DB GPU key, for the parts the device tool lends
#: (``nvidia-h100-x1``: "NVIDIA H100 80GB HBM3", ``nvidia-h200``: "NVIDIA H200"; device notes).
DEVICE_KEYS: dict[str, str] = {
    "NVIDIA H200": "h200-sxm-141gb",
    "NVIDIA H100 80GB HBM3": "h100-sxm-80gb",
}


def gpu_key_for_device(device_name: str, expect: str | None = None) -> str:
    """The profile-DB key of ``device_name`` (exact names of ``DEVICE_KEYS`` only); with
    ``expect``, that key or a ``ConfigError``."""
    key = DEVICE_KEYS.get(device_name.strip())
    if key is None:
        raise ConfigError(f"CUDA device {device_name!r} is not one of {sorted(DEVICE_KEYS)}; "
                          "refusing to file its timings under an H100 / H200 key")
    if expect is not None:
        from charon_search.cost.profile_db import normalize_gpu

        want = normalize_gpu(expect) or expect
        if want != key:
            raise ConfigError(f"expected {want}, but the CUDA device is {device_name!r} ({key})")
    return key


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--expect", default=None, help="GPU key the run must be on (e.g. "
                    "h200-sxm-141gb); another device is refused")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("FATAL: torch is not installed", file=sys.stderr)
        return 3
    if not torch.cuda.is_available() or not torch.version.cuda:
        print(f"FATAL: torch {torch.__version__} sees no CUDA GPU", file=sys.stderr)
        return 3
    cc = tuple(torch.cuda.get_device_capability(0))
    name = torch.cuda.get_device_name(0)
    if cc < (9, 0):
        print(f"FATAL: {name} is sm_{cc[0]}{cc[1]}; Hopper (sm_90) or newer expected",
              file=sys.stderr)
        return 2
    try:
        key = gpu_key_for_device(name, args.expect)
    except ConfigError as e:
        print(f"FATAL: {e}", file=sys.stderr)
        return 2
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    print(f"device {name!r} -> {key}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"cuDNN {cudnn}, sm_{cc[0]}{cc[1]}", file=sys.stderr)
    print(f"GPU_KEY={key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
