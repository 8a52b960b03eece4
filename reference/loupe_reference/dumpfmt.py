"""The dump layout shared with loupe (``loupe dump``): manifest, tensor files, print styles.

This module needs numpy only (no torch), so the layout is cheap to test. A dump is a
directory::

    DIR/manifest.json
    DIR/step0/<name>.npy        # style npy (default); .bin for style binary, .max for style max
    DIR/step1/<name>.npy        # decode step 1 (T = 1), ... one folder per step

``manifest.json`` (format "loupe-dump", version 1)::

    {"format": "loupe-dump", "version": 1,
     "producer": {"engine": "transformers", "version": "5.23.0"},
     "model": {"path": "...", "sha256": null},
     "prompt": "...", "chat": false, "prompt_tokens": [1, 2, 3],
     "precision": "f32",
     "tensors": [{"name": ..., "step": 0, "order": 0, "file": "step0/<name>.npy", "dtype": "f32",
                  "shape": [T, D], "axes": ["token", "hidden"],
                  "stats": {"min", "max", "mean", "std", "nan", "inf"}}, ...]}

Conventions:
- ``order`` is the execution order of the captures, counted over the whole dump (unique,
  increasing with step); ``tensors`` is listed in that order.
- ``file`` is relative to the dump directory, always with ``/``. File names are the tensor
  name with MAX's label sanitizing (``\\ / : ? " < > |`` and space become ``_``).
- stats are computed in float64 over the finite values (population std, ddof = 0); ``min``,
  ``max``, ``mean``, ``std`` are null when no value is finite; ``nan`` and ``inf`` count the
  others.
- dtype names: f32, f16, bf16, f64, i64, i32, u8, ... bf16 has no numpy dtype: with style npy
  its ``.npy`` holds the raw bits as ``<u2`` and the manifest says ``bf16`` (the manifest is
  authoritative).
- style ``binary`` writes raw little-endian C-order bytes (``.bin``), shape and dtype only in
  the manifest; style ``max`` writes MAX ``.max`` files (see ``max_file_bytes``).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence, TextIO

import numpy as np

FORMAT = "loupe-dump"
VERSION = 1
STYLES = ("npy", "binary", "max", "compact", "full")
FILE_STYLES = ("npy", "binary", "max")
FILE_EXT = {"npy": ".npy", "binary": ".bin", "max": ".max"}

# numpy dtype -> manifest name
_NP_NAMES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float16): "f16",
    np.dtype(np.float64): "f64",
    np.dtype(np.int64): "i64",
    np.dtype(np.int32): "i32",
    np.dtype(np.int16): "i16",
    np.dtype(np.int8): "i8",
    np.dtype(np.uint8): "u8",
    np.dtype(np.uint16): "u16",
    np.dtype(np.uint32): "u32",
    np.dtype(np.uint64): "u64",
    np.dtype(np.bool_): "bool",
}

#: MAX ``.max`` dtype codes (docs/dump-format.md, "The .max file").
MAX_DTYPE_CODES = {
    "bool": 1,
    "u8": 134, "u16": 136, "u32": 138, "u64": 140,
    "i8": 135, "i16": 137, "i32": 139, "i64": 141,
    "f16": 79, "bf16": 80, "f32": 81, "f64": 82,
    "f4_e2m1fn": 64, "f6_e2m3fn": 65, "f6_e3m2fn": 66,
    "f8_e8m0fnu": 73, "f8_e4m3fn": 75, "f8_e4m3fnuz": 76, "f8_e5m2": 77, "f8_e5m2fnuz": 78,
}
MAX_MAGIC = bytes([0x93, 0xF0, 0x9F, 0x94, 0xA5, 0x2B, 0x2B, 0x93])

_SANITIZE = re.compile(r'[\\/:?"<>| ]')


def sanitize_label(label: str) -> str:
    """MAX's file-name sanitizing: ``\\ / : ? " < > |`` and space become ``_``."""
    return _SANITIZE.sub("_", label)


def dtype_name(arr: np.ndarray, declared: str | None = None) -> str:
    if declared is not None:
        return declared
    try:
        return _NP_NAMES[arr.dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {arr.dtype}") from None


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 raw bits (uint16/int16) -> float32 values."""
    return (np.ascontiguousarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


@dataclass
class Entry:
    """One captured tensor. ``data`` holds the values (bf16: the raw bits as uint16, dtype "bf16")."""

    name: str
    step: int
    order: int
    data: np.ndarray
    dtype: str  # manifest dtype name
    axes: list[str] = field(default_factory=list)

    def values_f64(self) -> np.ndarray:
        if self.dtype == "bf16":
            return bf16_bits_to_f32(self.data).astype(np.float64)
        return np.asarray(self.data, dtype=np.float64)

    def values_for_print(self) -> np.ndarray:
        if self.dtype == "bf16":
            return bf16_bits_to_f32(self.data)
        return np.asarray(self.data)


def tensor_stats(values: np.ndarray) -> dict[str, Any]:
    """min, max, mean, std (population) over the finite values, in float64; NaN and Inf counts."""
    v = np.asarray(values, dtype=np.float64).ravel()
    nan = int(np.count_nonzero(np.isnan(v)))
    inf = int(np.count_nonzero(np.isinf(v)))
    finite = v[np.isfinite(v)] if (nan or inf) else v
    if finite.size == 0:
        return {"min": None, "max": None, "mean": None, "std": None, "nan": nan, "inf": inf}
    return {
        "min": float(finite.min()),
        "max": float(finite.max()),
        "mean": float(finite.mean()),
        "std": float(finite.std()),
        "nan": nan,
        "inf": inf,
    }


def file_path(entry: Entry, style: str) -> str:
    """Path of a tensor's file inside the dump directory (``/`` separators)."""
    return f"step{entry.step}/{sanitize_label(entry.name)}{FILE_EXT[style]}"


def manifest_entry(entry: Entry, style: str | None) -> dict[str, Any]:
    return {
        "name": entry.name,
        "step": entry.step,
        "order": entry.order,
        "file": file_path(entry, style) if style in FILE_STYLES else None,
        "dtype": entry.dtype,
        "shape": [int(d) for d in entry.data.shape],
        "axes": list(entry.axes),
        "stats": tensor_stats(entry.values_f64()),
    }


def build_manifest(header: dict[str, Any], entries: Sequence[Entry], style: str | None) -> dict[str, Any]:
    m: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    m.update(header)
    m["tensors"] = [manifest_entry(e, style) for e in sorted(entries, key=lambda e: e.order)]
    return m


def _le_contiguous(data: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(data)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and not _little_endian()):
        a = a.astype(a.dtype.newbyteorder("<"))
    return a


def _little_endian() -> bool:
    import sys

    return sys.byteorder == "little"


def max_file_bytes(label: str, data: np.ndarray, dtype: str) -> bytes:
    """A MAX ``.max`` checkpoint file (docs/dump-format.md, "The .max file"), little-endian:

    magic(8) | u32 major=0 | u32 minor=1 | u64 metadata_size | u32 keylen | key | u8 dtype | u8 rank |
    u32 dims[rank] | u64 data_offset (= 24 + metadata_size) | data (C order)
    with metadata_size = 4 + keylen + 2 + 4*rank + 8 and key = the sanitized label (no NUL).
    """
    key = sanitize_label(label).encode("utf-8")
    code = MAX_DTYPE_CODES[dtype]
    shape = [int(d) for d in data.shape]
    rank = len(shape)
    if rank > 255:
        raise ValueError(f"{label}: rank {rank} does not fit a .max file")
    metadata_size = 4 + len(key) + 2 + 4 * rank + 8
    data_offset = 24 + metadata_size
    out = bytearray()
    out += MAX_MAGIC
    out += struct.pack("<IIQ", 0, 1, metadata_size)
    out += struct.pack("<I", len(key)) + key
    out += struct.pack("<BB", code, rank)
    out += struct.pack(f"<{rank}I", *shape)
    out += struct.pack("<Q", data_offset)
    assert len(out) == data_offset
    out += _le_contiguous(data).tobytes()
    return bytes(out)


def read_max_file(blob: bytes) -> tuple[str, int, list[int], bytes]:
    """Parse a ``.max`` file: (key, dtype code, shape, data bytes). For tests and tools."""
    if blob[:8] != MAX_MAGIC:
        raise ValueError("not a .max file (bad magic)")
    major, minor, metadata_size = struct.unpack_from("<IIQ", blob, 8)
    if major > 0:
        raise ValueError(f"unsupported .max major version {major}")
    (keylen,) = struct.unpack_from("<I", blob, 24)
    key = blob[28 : 28 + keylen].decode("utf-8")
    pos = 28 + keylen
    code, rank = struct.unpack_from("<BB", blob, pos)
    pos += 2
    shape = list(struct.unpack_from(f"<{rank}I", blob, pos))
    pos += 4 * rank
    (offset,) = struct.unpack_from("<Q", blob, pos)
    if offset != 24 + metadata_size:
        raise ValueError("inconsistent .max data offset")
    return key, code, shape, blob[offset:]


def write_tensor_file(path: str, entry: Entry, style: str) -> None:
    if style == "npy":
        np.save(path, _le_contiguous(entry.data), allow_pickle=False)
    elif style == "binary":
        with open(path, "wb") as f:
            f.write(_le_contiguous(entry.data).tobytes())
    elif style == "max":
        with open(path, "wb") as f:
            f.write(max_file_bytes(entry.name, entry.data, entry.dtype))
    else:
        raise ValueError(f"style {style!r} writes no files")


def check_output_dir(target: str) -> None:
    """An output directory may be new, empty, or an earlier dump (it holds manifest.json), which
    is replaced (as ``loupe dump`` does)."""
    if os.path.lexists(target):
        if not os.path.isdir(target):
            raise ValueError(f"{target}: exists and is not a directory")
        if os.listdir(target) and not os.path.isfile(os.path.join(target, "manifest.json")):
            raise ValueError(f"{target}: exists and is not a loupe dump; choose another -o")


class AtomicDir:
    """Write into a temporary directory beside ``target`` and rename it into place on success,
    so an error never leaves a partial dump (``check_output_dir`` says what ``target`` may be)."""

    def __init__(self, target: str):
        self.target = os.path.abspath(target)
        check_output_dir(self.target)
        parent = os.path.dirname(self.target)
        os.makedirs(parent, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="." + os.path.basename(self.target) + ".partial-", dir=parent)

    def commit(self) -> str:
        old = None
        if os.path.lexists(self.target):
            check_output_dir(self.target)
            old = tempfile.mkdtemp(prefix="." + os.path.basename(self.target) + ".old-", dir=os.path.dirname(self.target))
            os.rename(self.target, os.path.join(old, "d"))
        try:
            os.rename(self.tmp, self.target)
        except OSError:
            if old is not None:
                os.rename(os.path.join(old, "d"), self.target)
                os.rmdir(old)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.target

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


class DumpWriter:
    """Streams entries into a staging directory as they are captured (so a long dump does not
    hold every tensor in memory), then writes manifest.json and renames the directory into
    place (``finish``); ``abort`` removes everything. Usable as a context manager that aborts
    unless ``finish`` ran."""

    def __init__(self, out_dir: str, style: str = "npy"):
        if style not in FILE_STYLES:
            raise ValueError(f"style {style!r} writes no files (use one of {', '.join(FILE_STYLES)})")
        self.style = style
        self.staging = AtomicDir(out_dir)
        self.meta: list[dict[str, Any]] = []
        self.files: set[str] = set()
        self.done = False

    def add(self, entry: Entry) -> None:
        rel = file_path(entry, self.style)
        if rel in self.files:
            raise ValueError(f"two tensors map to the same file {rel}")
        self.files.add(rel)
        path = os.path.join(self.staging.tmp, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_tensor_file(path, entry, self.style)
        self.meta.append(manifest_entry(entry, self.style))

    def finish(self, header: dict[str, Any]) -> dict[str, Any]:
        manifest: dict[str, Any] = {"format": FORMAT, "version": VERSION}
        manifest.update(header)
        manifest["tensors"] = sorted(self.meta, key=lambda m: m["order"])
        with open(os.path.join(self.staging.tmp, "manifest.json"), "w", encoding="utf-8") as f:
            json.dump(manifest, f, ensure_ascii=False, allow_nan=False, indent=1)
            f.write("\n")
        self.staging.commit()
        self.done = True
        return manifest

    def abort(self) -> None:
        if not self.done:
            self.staging.abort()

    def __enter__(self) -> "DumpWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.abort()


def write_dump(out_dir: str, header: dict[str, Any], entries: Sequence[Entry], style: str = "npy") -> dict[str, Any]:
    """Write a whole dump atomically; returns the manifest."""
    with DumpWriter(out_dir, style) as w:
        for e in entries:
            w.add(e)
        return w.finish(header)


# ---------------------------------------------------------------- printing (compact / full)

COMPACT_MAX = 7  # a dimension of 7 or more shows its first and last 3 entries
COMPACT_SIDE = COMPACT_MAX // 2
ROW_FILLER = "\n ..., \n"  # between the kept rows / matrices of an elided run
MAX_FLOAT_CHARS = 31  # MAX formats a COMPACT float into a 32-byte buffer
# loupe dump dtype names -> MAX's names in prints (tests/fixtures/max-26.7/prints).
MAX_DTYPES = {"i8": "si8", "i16": "si16", "i32": "si32", "i64": "si64",
              "u8": "ui8", "u16": "ui16", "u32": "ui32", "u64": "ui64"}


def _special(x: float) -> str | None:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "INF" if x > 0 else "-INF"
    return None


def _element(x, fmt) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "True" if x else "False"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return fmt(float(x))


def _fmt_compact(x: float) -> str:
    return _special(x) or f"{x:.4f}"[:MAX_FLOAT_CHARS]


def _fmt_full(precision: int):
    def fmt(x: float) -> str:
        return _special(x) or f"{x:.{precision}e}"

    return fmt


def _row(row: np.ndarray) -> str:
    n = row.shape[0]
    el = [_element(x, _fmt_compact) for x in (row if n < COMPACT_MAX else
                                            list(row[:COMPACT_SIDE]) + list(row[n - COMPACT_SIDE:]))]
    if n >= COMPACT_MAX:
        return "[" + ", ".join(el[:COMPACT_SIDE]) + ", ..., " + ", ".join(el[COMPACT_SIDE:]) + "]"
    return "[" + ", ".join(el) + "]"


def _shown(n: int) -> list[int | None]:
    if n >= COMPACT_MAX:
        return list(range(COMPACT_SIDE)) + [None] + list(range(n - COMPACT_SIDE, n))
    return list(range(n))


def serialize(values: np.ndarray) -> str:
    """MAX 26.7's COMPACT body, byte for byte (tests/fixtures/max-26.7/prints/compact.txt): the
    tensor as a series of 2-D matrices (leading dims flattened; rank 0 and 1 are one row), each
    ``[`` rows ``]``, rows joined by ``",\n"``, matrices by ``",\n\n"``, one extra ``[`` ``]``
    per dimension beyond 2. A row of 7 or more shows its first and last 3 around ``..., ``; 7
    or more rows / matrices show their first and last 3 with ``"\n ..., \n"`` between. Floats
    in 4 decimals (cut at 31 characters), ``nan``, ``INF``, ``-INF``; an empty tensor is ``[]``."""
    a = np.asarray(values)
    if a.size == 0:
        return "[]"
    rank = a.ndim
    cols = a.shape[-1] if rank else 1
    rows = 1 if rank < 2 else a.shape[-2]
    mats = int(np.prod(a.shape[:-2])) if rank > 2 else 1
    m3 = a.reshape(mats, rows, cols)
    out: list[str] = ["[" * max(rank - 2, 0)]
    first_mat = True
    for mi in _shown(mats):
        if mi is None:
            out.append(ROW_FILLER)
            continue
        if not first_mat:
            out.append(",\n\n")
        first_mat = False
        out.append("[")
        first_row = True
        for ri in _shown(rows):
            if ri is None:
                out.append(ROW_FILLER)
                continue
            if not first_row:
                if out[-1] != ROW_FILLER:
                    out.append(",")
                out.append("\n")
            first_row = False
            out.append(_row(m3[mi, ri]))
            if rows >= COMPACT_MAX and ri == COMPACT_SIDE - 1:
                out.append(",")
        out.append("]")
    out.append("]" * max(rank - 2, 0))
    return "".join(out)


def format_tensor(label: str, values: np.ndarray, dtype: str, compact: bool = True, precision: int = 6) -> str:
    """One tensor as MAX 26.7 prints it (no newline). COMPACT:
    ``label = tensor([[1.1235, ..., 1.1235]], dtype=f32, shape=[2,20])``; FULL:
    ``label = tensor<2x20xf32> [1.123450e+00, ...]``, every element in one flat list."""
    dtype = MAX_DTYPES.get(dtype, dtype)
    shape = np.shape(values)
    if compact:
        dims = ",".join(str(int(d)) for d in shape)
        return f"{label} = tensor({serialize(values)}, dtype={dtype}, shape=[{dims}])"
    ty = "".join(f"{int(d)}x" for d in shape) + dtype
    fmt = _fmt_full(precision)
    flat = ", ".join(_element(x, fmt) for x in np.asarray(values).ravel())
    return f"{label} = tensor<{ty}> [{flat}]"


class Printer:
    """Prints entries as they come (COMPACT or FULL); with ``steps_header`` a ``# step K`` line
    opens each step."""

    def __init__(self, stream: TextIO, style: str = "compact", precision: int = 6, steps_header: bool = False):
        if style not in ("compact", "full"):
            raise ValueError(f"style {style!r} does not print")
        self.stream, self.compact, self.precision, self.steps_header = stream, style == "compact", precision, steps_header
        self.current: int | None = None

    def add(self, e: Entry) -> None:
        if self.steps_header and e.step != self.current:
            self.stream.write(f"# step {e.step}\n")
            self.current = e.step
        self.stream.write(format_tensor(e.name, e.values_for_print(), e.dtype, self.compact, self.precision) + "\n")


def print_entries(entries: Iterable[Entry], stream: TextIO, style: str = "compact", precision: int = 6,
                  steps_header: bool = False) -> None:
    """Print tensors in execution order."""
    p = Printer(stream, style, precision, steps_header)
    for e in sorted(entries, key=lambda e: e.order):
        p.add(e)
    stream.flush()


def json_safe(x: Any) -> Any:
    """Replace non-finite floats by None (manifest JSON has no NaN)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x
