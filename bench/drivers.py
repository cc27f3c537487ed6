"""The drivers around the measurements: the installed idem build (its digest,
and whether it is an optimized build) and the compiled C driver of B3
(redis_txn.c)."""
import hashlib
import os
import shutil
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))

PG_CONFIG = "/usr/lib/postgresql/15/bin/pg_config"   # main() sets it from --pg-bin


def idem_so_digest():
    pkglib = subprocess.run([PG_CONFIG, "--pkglibdir"],
                            capture_output=True, text=True).stdout.strip()
    try:
        with open(os.path.join(pkglib, "idem.so"), "rb") as f:
            return hashlib.md5(f.read()).hexdigest()
    except OSError:
        return None


def idem_build():
    """Is the installed idem.so an optimized build? Compare it with the
    project's target/{debug,release}/libidem.so, else guess from its size."""
    pkglib = subprocess.run([PG_CONFIG, "--pkglibdir"],
                            capture_output=True, text=True).stdout.strip()
    so = os.path.join(pkglib, "idem.so")
    if not os.path.exists(so):
        return "unknown (idem.so not found)"

    def digest(path):
        h = hashlib.md5()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()

    d = digest(so)
    root = os.path.dirname(BENCH)
    for kind in ("release", "debug"):
        cand = os.path.join(root, "target", kind, "libidem.so")
        if os.path.exists(cand) and digest(cand) == d:
            return f"{kind} (identical to target/{kind}/libidem.so)"
    size_mb = os.path.getsize(so) / 1e6
    # A release build (profile.release, cargo pgrx install --release) carries
    # no DWARF; a debug build does, and is several times larger.
    has_dwarf = b".debug_info" in elf_section_names(so)
    guess = "probably debug (unoptimized)" if has_dwarf and size_mb > 20 else "probably release"
    return f"{guess}: {size_mb:.0f} MB{', with debug info' if has_dwarf else ''}"


def elf_section_names(path):
    import struct
    try:
        with open(path, "rb") as f:
            h = f.read(64)
            if h[:4] != b"\x7fELF" or h[4] != 2:
                return b""
            shoff, = struct.unpack_from("<Q", h, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", h, 0x3A)
            f.seek(shoff + shstrndx * shentsize)
            sh = f.read(shentsize)
            off, size = struct.unpack_from("<QQ", sh, 0x18)
            f.seek(off)
            return f.read(size)
    except (OSError, struct.error):
        return b""


def build_redis_driver(out, pg_bin):
    src = os.path.join(BENCH, "redis_txn.c")
    exe = os.path.join(out, "redis_txn")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    inc = subprocess.run([os.path.join(pg_bin, "pg_config"), "--includedir"], capture_output=True,
                         text=True).stdout.strip()
    libdir = subprocess.run([os.path.join(pg_bin, "pg_config"), "--libdir"], capture_output=True,
                            text=True).stdout.strip()
    p = subprocess.run([cc, "-O2", "-o", exe, src, f"-I{inc}", f"-L{libdir}", "-lpq", "-lpthread"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        return None
    return exe
