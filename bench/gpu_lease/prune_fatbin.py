"""Zero the CUDA kernels of every GPU architecture but one in a shared library's fatbin.

onnxruntime-gpu's CUDA provider (284 MB) carries cubins for sm_75, 80, 86, 89, 90 and 120
and no PTX; a device call carries at most 64 MiB. Zeroed cubins compress to nothing, so
keeping sm_90 (H100/H200) alone brings the library to 52 MB with xz. The entry headers stay
intact: the driver picks the sm_90 entry by its header and never reads the others.

    python bench/gpu_lease/prune_fatbin.py LIB.so 90 OUT.so
"""

from __future__ import annotations

import collections
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50


def fatbin_section(path: str) -> tuple[int, int]:
    for line in subprocess.check_output(["readelf", "-S", "-W", path], text=True).splitlines():
        if ".nv_fatbin" in line:
            fields = line.split("]", 1)[1].split()
            return int(fields[3], 16), int(fields[4], 16)
    raise SystemExit(f"{path}: no .nv_fatbin section")


def entries(data: bytes, offset: int, size: int):
    """(payload offset, payload size, kind, sm) of every entry of every fatbin container."""
    pos, end = offset, offset + size
    while pos < end:
        magic, _version, header, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned
            continue
        e = pos + header
        while e < pos + header + fat_size:
            kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", data, e)
            sm = struct.unpack_from("<I", data, e + 28)[0]
            yield e + entry_header, payload, kind, sm
            e += entry_header + payload
        pos += header + fat_size


def main(path: str, keep_sm: int, out: str) -> None:
    data = bytearray(open(path, "rb").read())
    tally: collections.Counter = collections.Counter()
    for start, size, kind, sm in entries(data, *fatbin_section(path)):
        tally[(kind, sm)] += size
        if sm != keep_sm:
            data[start:start + size] = bytes(size)
    if (2, keep_sm) not in tally:
        raise SystemExit(f"{path}: no sm_{keep_sm} cubins; nothing would run")
    for (kind, sm), size in sorted(tally.items()):
        print(f"{'cubin' if kind == 2 else 'ptx'} sm_{sm}: {size / 2**20:.1f} MiB{'' if sm == keep_sm else ' (zeroed)'}")
    open(out, "wb").write(data)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
