#!/usr/bin/env python3
"""pack_mlx_cuda.py — brings MLX's CUDA backend (the `mlx-cuda` peer of `qmm bench --backend cuda`) to a GPU
machine without a package registry, in one piece under a 64 MiB transfer limit.

On a machine where pip can download: fetches the mlx and mlx-cuda-13 wheels (version below, Python 3.12,
manylinux x86-64), unpacks both into a site folder, and in libmlx.so's .nv_fatbin section overwrites with zeros
the payload of every device-code entry whose architecture is not ARCH (default 90: sm_90a, the H200/H100's).
The ELF layout, the fat-binary headers and the kept entry are untouched, so the CUDA runtime still finds its
sm_90a code; the zeroed entries (sm_75/80/100a/120a/121a and the PTX) then compress to nothing. Output:
.deps/mlx-site-smARCH.tar.xz (~22 MB for sm 90; git-ignored under .deps), written to a temporary file first and
renamed when complete. On the GPU machine:

    tar -xJf .deps/mlx-site-sm90.tar.xz -C /tmp
    ln -sfn "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')" /tmp/site/nvidia  # libmlx's RPATH
    PYTHONPATH=/tmp/site ./build-gpu/qmm bench --backend cuda ...

MLX compiles some kernels at run time with NVRTC and needs its headers (mlx/include), which are kept. Only for
benchmarking: the result runs on sm_90 devices only.
Fat-binary layout (CUDA's fatbinary container, as read here): a container header {u32 magic 0xBA55ED50, u16
version, u16 header size, u64 payload size}, then entries {u16 kind, u16 version, u32 header size, u64 payload
size, ..., u32 sm version at byte 28}, each followed by its payload."""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile

VERSION = "0.32.4"
FATBIN_MAGIC = 0xBA55ED50


def blank_other_archs(data, section_offset, section_size, keep_sm):
    """Zeroes the payload of every fat-binary entry whose sm version is not keep_sm; returns (kept, blanked) bytes."""
    p, end, kept, blanked = section_offset, section_offset + section_size, 0, 0
    while p + 16 <= end:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, p)
        if magic != FATBIN_MAGIC:
            p += 8  # containers are 8-byte aligned
            continue
        q, q_end = p + header_size, p + header_size + fat_size
        while q + 32 <= q_end:
            _kind, _entry_version, entry_header, payload = struct.unpack_from("<HHIQ", data, q)
            sm = struct.unpack_from("<I", data, q + 28)[0]
            if entry_header == 0:
                break
            if sm == keep_sm:
                kept += payload
            else:
                data[q + entry_header:q + entry_header + payload] = bytes(payload)
                blanked += payload
            q += entry_header + payload
        p = q_end
    return kept, blanked


def fatbin_section(path):
    out = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = line.replace("[ ", "[").split()
        if ".nv_fatbin" in fields:
            i = fields.index(".nv_fatbin")
            return int(fields[i + 3], 16), int(fields[i + 4], 16)
    raise SystemExit(f"pack_mlx_cuda: no .nv_fatbin section in {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90, help="the sm version whose device code is kept (default 90)")
    ap.add_argument("--out", help="the tar.xz to write (default .deps/mlx-site-smARCH.tar.xz; .deps is git-ignored)")
    a = ap.parse_args()
    if a.arch <= 0:
        ap.error(f"--arch {a.arch}: an sm version is a positive number (90 for sm_90a)")
    out = a.out or f".deps/mlx-site-sm{a.arch}.tar.xz"
    folder = os.path.dirname(os.path.abspath(out))
    if os.path.isdir(out) or out.endswith(os.sep):
        ap.error(f"--out {out}: is a directory; name the .tar.xz file to write")
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            ap.error(f"--out {out}: {folder} is not a folder")
        if a.out:
            ap.error(f"--out {out}: its folder {folder} does not exist")
        os.makedirs(folder, exist_ok=True)  # the default .deps/
    if not os.access(folder, os.W_OK):
        ap.error(f"--out {out}: its folder {folder} is not writable")
    work = tempfile.mkdtemp(prefix="pack_mlx_cuda.")
    try:
        wheels = os.path.join(work, "wheels")
        for package in (f"mlx=={VERSION}", f"mlx-cuda-13=={VERSION}"):
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_35_x86_64",
                            "-d", wheels, package], check=True)
        site = os.path.join(work, "site")
        for wheel in sorted(os.listdir(wheels)):
            with zipfile.ZipFile(os.path.join(wheels, wheel)) as z:
                z.extractall(site)
        lib = os.path.join(site, "mlx", "lib", "libmlx.so")
        data = bytearray(open(lib, "rb").read())
        offset, size = fatbin_section(lib)
        kept, blanked = blank_other_archs(data, offset, size, a.arch)
        if kept == 0:
            raise SystemExit(f"pack_mlx_cuda: libmlx.so has no device code for sm {a.arch}")
        with open(lib, "wb") as f:
            f.write(data)
        # Written beside the target and renamed when complete: an interrupted run leaves no half archive.
        fd, partial = tempfile.mkstemp(prefix=".pack_mlx_cuda.", suffix=".tar.xz", dir=folder)
        os.close(fd)
        try:
            with tarfile.open(partial, "w:xz", preset=6) as tar:
                tar.add(site, arcname="site")
            os.chmod(partial, 0o644)
            os.replace(partial, out)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        print(f"pack_mlx_cuda: kept {kept} bytes of sm {a.arch} device code, blanked {blanked}; "
              f"wrote {out} ({os.path.getsize(out)} bytes)", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
