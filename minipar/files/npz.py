"""An .npz opened without trusting it: every size it declares is checked against its bytes
before anything is allocated, so a damaged or hostile file is refused, never read.

An .npz is a zip of .npy members. Three layers each declare a size, and each is checked
against the one below before a byte of array data is read:

    the file        its length on disk, L bytes
    the zip         each member's entry: where it starts, compress_size C (<= L) and
                    file_size F, the bytes it unzips to: F == C when stored, and
                    F <= 1032 * C when deflated (deflate's largest ratio)
    the .npy        a header of H bytes declaring shape s and dtype d, then the data:
                    prod(s) * d.itemsize == F - H exactly

So the largest array a file of L bytes can make the reader allocate is about 1032 * L
bytes, and a 300-byte file whose header declares 128 GiB is refused by its sizes. Reading
then checks the zip's CRC-32; a member that ends early or fails it is named with its file.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from .errors import CheckpointError, PickledCheckpointError

#: deflate's largest compression ratio (a 258-byte match per 2 bits, RFC 1951): a deflated
#: member of C bytes unzips to at most this many times C
DEFLATE_MAX_RATIO = 1032
_LOCAL_HEADER = 30  # bytes of a zip local file header before its name and extra field
#: what zipfile and zlib raise on damaged bytes (a CRC-32 mismatch, a member ending early)
_ZIP_DAMAGE = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError,
               NotImplementedError, RuntimeError)
#: ... and NumPy's header parser on a damaged header
_DAMAGE = _ZIP_DAMAGE + (ValueError, TypeError, KeyError, SyntaxError, RecursionError,
                         OverflowError)


@dataclass(frozen=True)
class Member:
    """One .npy member, its header read and its sizes checked; no data read yet."""

    name: str              # "<array>.npy"
    info: zipfile.ZipInfo
    shape: tuple[int, ...]
    dtype: np.dtype


def pickle_refusal(file: Path, what: str) -> PickledCheckpointError:
    return PickledCheckpointError(
        f"checkpoint {file} holds a pickled object ({what}); minipar checkpoints never "
        "unpickle, because unpickling can run arbitrary code. Re-save it with "
        "minipar.files.save_arrays, from numeric arrays (put strings and other small "
        "values in `meta`).")


def npy_header(fp: IO[bytes], file: Path, member: str) -> tuple[tuple, bool, np.dtype]:
    """(shape, fortran_order, dtype) of a .npy header, parsed as a literal (no code runs)."""
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ValueError(f".npy format version {version} (minipar reads 1.0 and 2.0)")
    except _ZIP_DAMAGE:
        raise  # the zip's damage, not the header's: the caller names it
    except _DAMAGE as e:
        raise CheckpointError(f"{file}: member {member!r} is not a readable .npy array: {e}"
                              ) from None
    return shape, fortran, dtype


def refuse_non_zip(npz: Path) -> None:
    """Refuse a missing file, a pickle, a bare .npy or anything else that is not a zip."""
    if not npz.is_file():
        raise CheckpointError(f"checkpoint file {npz} does not exist; save_arrays writes "
                              "<path>.npz and <path>.json, pass <path>")
    if zipfile.is_zipfile(npz):
        return
    with open(npz, "rb") as f:
        head = f.read(6)
    if head[:1] == b"\x80":
        raise pickle_refusal(npz, "the whole file is a pickle")
    if head == b"\x93NUMPY":
        with open(npz, "rb") as f:
            _, _, dtype = npy_header(f, npz, npz.name)
        if dtype.hasobject:
            raise pickle_refusal(npz, "a single .npy array of dtype object")
        raise CheckpointError(f"{npz} is a single .npy array, expected an .npz archive; "
                              "save it with minipar.files.save_arrays")
    raise CheckpointError(f"{npz} is not an .npz (zip) archive; it is damaged or not a "
                          "minipar checkpoint")


def open_npz(npz: Path) -> zipfile.ZipFile:
    """The zip, its directory checked against the file's length (refuse_non_zip first)."""
    try:
        zf = zipfile.ZipFile(npz)
    except _DAMAGE as e:
        raise CheckpointError(f"{npz} is a damaged zip archive ({e}); restore it from the "
                              "save that wrote it") from None
    length = npz.stat().st_size
    seen = set()
    for info in zf.infolist():
        name = info.filename
        if name in seen:
            zf.close()
            raise CheckpointError(f"{npz} lists member {name!r} twice; it is damaged")
        seen.add(name)
        why = None
        if info.header_offset + _LOCAL_HEADER + info.compress_size > length:
            why = (f"its directory places {info.compress_size} bytes at offset "
                   f"{info.header_offset}, beyond the file's {length} bytes (truncated?)")
        elif info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            why = (f"it is stored uncompressed but declares {info.file_size} bytes in "
                   f"{info.compress_size}")
        elif info.compress_type == zipfile.ZIP_DEFLATED and \
                info.file_size > DEFLATE_MAX_RATIO * info.compress_size:
            why = (f"it declares {info.file_size} bytes deflated into {info.compress_size}, "
                   f"more than deflate's largest ratio ({DEFLATE_MAX_RATIO}:1) allows")
        elif info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            why = (f"it uses zip compression method {info.compress_type}; minipar writes "
                   "stored or deflated members only")
        if why:
            zf.close()
            raise CheckpointError(f"{npz}: member {name!r} is damaged: {why}")
    return zf


def members(zf: zipfile.ZipFile, npz: Path) -> dict[str, Member]:
    """Every member's header, pickles refused, its declared data size checked; by array name."""
    out = {}
    for info in zf.infolist():
        try:
            with zf.open(info) as fp:
                shape, _, dtype = npy_header(fp, npz, info.filename)
                header = fp.tell()
        except _ZIP_DAMAGE as e:
            raise _damaged(npz, info.filename, e) from None
        if dtype.hasobject:
            raise pickle_refusal(npz, f"member {info.filename!r} has dtype {dtype}")
        if any(d < 0 for d in shape):
            raise CheckpointError(f"{npz}: member {info.filename!r} declares the shape "
                                  f"{list(shape)}, with a negative size; it is damaged")
        declared = math.prod(shape) * dtype.itemsize
        if declared != info.file_size - header:
            raise CheckpointError(
                f"{npz}: member {info.filename!r} declares {dtype} of shape {list(shape)}, "
                f"{declared} bytes of data, but holds {info.file_size - header}; it is "
                "truncated or damaged, and is refused before anything is allocated")
        out[info.filename.removesuffix(".npy")] = Member(info.filename, info, shape, dtype)
    return out


def read_member(zf: zipfile.ZipFile, m: Member, npz: Path) -> np.ndarray:
    """The array of a checked member (its size is already known to match its bytes), the
    zip's CRC-32 verified."""
    try:
        with zf.open(m.info) as fp:
            a = np.lib.format.read_array(fp, allow_pickle=False)
            if fp.read(1):  # reading to the end is what checks the CRC
                raise ValueError("data beyond the declared array")
    except _DAMAGE as e:
        raise _damaged(npz, m.name, e) from None
    return a


def _damaged(npz: Path, member: str, e: BaseException) -> CheckpointError:
    return CheckpointError(f"{npz}: array {member.removesuffix('.npy')!r} (member {member!r}) "
                           f"is damaged: {e}; restore the checkpoint from its save")
