"""Which GPU a plan is built for.

A serialized TensorRT plan runs only on the GPU model and compute capability
(and the TensorRT build) it was made for: the engine and timing caches key on
this. Read through the CUDA runtime library Polygraphy already loads
(`polygraphy.cuda.wrapper().handle`, a ctypes CDLL of libcudart):
`cudaGetDevice`, `cudaDeviceGetAttribute` with cudaDevAttrComputeCapabilityMajor
(75) and ...Minor (76) from cuda_runtime_api.h, and the device name, the first
field (`char name[256]`) of `cudaDeviceProp`. When any of it fails the
identity is "unknown"; the engine then still evicts a cached plan that does
not deserialize, so a wrong guess costs a rebuild, not a wrong answer."""

from __future__ import annotations

import ctypes
from functools import lru_cache

_CC_MAJOR, _CC_MINOR = 75, 76
_PROP_BYTES = 8192  # larger than cudaDeviceProp in any CUDA release; only name[256] is read


def gpu_identity(name: str, major: int, minor: int) -> str:
    return f"{name.strip() or 'GPU'} (sm_{int(major)}{int(minor)})"


@lru_cache(maxsize=1)
def current_gpu() -> str:
    try:
        from polygraphy import cuda

        lib = cuda.wrapper().handle
        dev, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
        if lib.cudaGetDevice(ctypes.byref(dev)) != 0:
            return "unknown"
        if (lib.cudaDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, dev)
                or lib.cudaDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, dev)):
            return "unknown"
        return gpu_identity(_device_name(lib, dev), major.value, minor.value)
    except Exception:  # no CUDA runtime, no device, an old driver: the cache cannot tell GPUs apart
        return "unknown"


def _device_name(lib, dev) -> str:
    """CUDA 12 headers map cudaGetDeviceProperties to `_v2`; the runtime may
    export either: try both, the name is "" when neither answers."""
    prop = ctypes.create_string_buffer(_PROP_BYTES)
    for symbol in ("cudaGetDeviceProperties_v2", "cudaGetDeviceProperties"):
        fn = getattr(lib, symbol, None)
        if fn is not None and fn(prop, dev) == 0:
            return prop.raw[:256].split(b"\0", 1)[0].decode("utf-8", "replace")
    return ""
