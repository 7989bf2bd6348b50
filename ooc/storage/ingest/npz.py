"""Arrays inside an ``.npz`` (a zip of ``.npy`` members, as ``np.savez`` writes) read at
bounded memory, never ``np.load`` of a whole member.

A stored (uncompressed) member is read in place: :func:`npz_member` finds where its bytes
start inside the zip and hands back an :class:`~.edgelist.NpyReader` over that range. A
deflated member (``np.savez_compressed``) cannot be read at an offset, so it is inflated
once, streamed in blocks, into a scratch folder the caller owns and removes (its size is
checked against the free disk first).
"""
from __future__ import annotations

import shutil
import struct
import zipfile
import zlib
from pathlib import Path

from ooc.storage.ingest.edgelist import NpyReader, input_error

#: Bytes inflated per read.
BLOCK = 16 << 20
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zip local file header, 30 bytes


def members(npz: Path) -> list[str]:
    """Names of the arrays in ``npz`` (member names without ``.npy``)."""
    with _open(npz) as zf:
        return [i.filename[:-4] for i in zf.infolist() if i.filename.endswith(".npy")]


def _open(npz: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(npz)
    except FileNotFoundError:
        raise input_error(npz, "not found") from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise input_error(npz, f"not a zip (.npz) file, or truncated ({e})") from None


def _data_start(npz: Path, info: zipfile.ZipInfo, label: str) -> int:
    """Byte offset of a stored member's data in the zip file."""
    with open(npz, "rb") as f:
        f.seek(info.header_offset)
        head = f.read(_LOCAL_HEADER.size)
    if len(head) < _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
        raise input_error(label, "the zip's local header is missing or damaged")
    fields = _LOCAL_HEADER.unpack(head)
    start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
    if start + info.file_size > npz.stat().st_size:
        raise input_error(label, f"truncated: the zip holds {max(0, npz.stat().st_size - start)} of its "
                          f"{info.file_size} bytes")
    return start


def _inflate(zf: zipfile.ZipFile, info: zipfile.ZipInfo, dest: Path, label: str) -> None:
    free = shutil.disk_usage(dest.parent).free
    if info.file_size > free:
        raise input_error(dest.parent, f"no room to inflate {label}: it needs {info.file_size:,} bytes, "
                                f"{free:,} are free")
    try:
        with zf.open(info) as src, open(dest, "wb") as out:
            while True:
                block = src.read(BLOCK)
                if not block:
                    break
                out.write(block)
    except (zlib.error, EOFError, zipfile.BadZipFile) as e:
        dest.unlink(missing_ok=True)
        raise input_error(label, f"compressed data is truncated or corrupt ({e})") from None


def npz_member(npz: Path, name: str, scratch: Path) -> NpyReader:
    """A reader over array ``name`` of ``npz``; a deflated member is inflated into
    ``scratch`` first. Errors name ``<npz>:<name>.npy``."""
    member = f"{name}.npy"
    label = f"{npz}:{member}"
    with _open(npz) as zf:
        try:
            info = zf.getinfo(member)
        except KeyError:
            have = sorted(i.filename for i in zf.infolist())
            raise input_error(npz, f"has no array {name!r} (members: {', '.join(have) or 'none'})") \
                from None
        if info.compress_type == zipfile.ZIP_STORED:
            return NpyReader(npz, start=_data_start(npz, info, label), name=label,
                             size=info.file_size)
        if info.compress_type != zipfile.ZIP_DEFLATED:
            raise input_error(label, f"uses zip compression method {info.compress_type}; only stored "
                              f"and deflated members are read")
        scratch.mkdir(parents=True, exist_ok=True)
        dest = scratch / member
        _inflate(zf, info, dest, label)
    return NpyReader(dest, name=label)
