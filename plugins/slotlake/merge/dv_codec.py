"""Delta's deletion vectors, as bytes: the descriptor of a `deletionVector` action field, the serialized bitmap and
the `deletion_vector_<uuid>.bin` file that holds them (PROTOCOL.md, "Deletion Vectors"). Pure: no I/O here.

- A descriptor: `storageType` `u` (a file next to the table's data: `pathOrInlineDv` is an optional random prefix
  followed by the file's UUID in 20 characters of Z85), `i` (the bitmap inline, Z85) or `p` (an absolute path);
  `offset` (in the file) of the bitmap's 4-byte size; `sizeInBytes` of the bitmap; `cardinality` (rows deleted).
- A bitmap ("RoaringBitmapArray", portable): the magic 1681511377 (int32 LE), the number of 32-bit bitmaps
  (int64 LE), then each one's high 32 bits (int32 LE) and the bitmap in Roaring's portable format.
- A file: one version byte (1), then per bitmap: its size (int32 BE), its bytes, their CRC-32 (int32 BE).
"""
from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

MAGIC = 1681511377
FILE_VERSION = 1
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
_UUID_CHARS = 20  # 16 bytes in Z85


def z85_encode(data: bytes) -> str:
    """Z85 of `data` (a multiple of 4 bytes; Delta pads an inline bitmap to one)."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte words")
    out = []
    for (word,) in struct.iter_unpack(">I", data):
        chars = []
        for _ in range(5):
            word, r = divmod(word, 85)
            chars.append(_Z85[r])
        out.append("".join(reversed(chars)))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise ValueError(f"not Z85: {len(text)} characters")
    out = bytearray()
    for at in range(0, len(text), 5):
        word = 0
        for c in text[at:at + 5]:
            word = word * 85 + _Z85_VALUE[c]
        out += struct.pack(">I", word)
    return bytes(out)


def file_name(file_id: uuid.UUID) -> str:
    return f"deletion_vector_{file_id}.bin"


def relative_path(descriptor: Mapping[str, Any]) -> str:
    """The file (relative to the table) of a `u` descriptor."""
    text = str(descriptor["pathOrInlineDv"])
    prefix, encoded = text[:-_UUID_CHARS], text[-_UUID_CHARS:]
    name = file_name(uuid.UUID(bytes=z85_decode(encoded)))
    return f"{prefix}/{name}" if prefix else name


def serialize(rows: Any) -> bytes:
    """The bitmap of a `pyroaring.BitMap` of row indexes (all below 2**32: one 32-bit bitmap, high bits 0)."""
    body = rows.serialize() if len(rows) else b""
    if not body:
        return struct.pack("<iq", MAGIC, 0)
    return struct.pack("<iqi", MAGIC, 1, 0) + body


def deserialize(data: bytes) -> Any:
    """The row indexes (a `pyroaring.BitMap`; row indexes past 2**32 refused) of a serialized bitmap."""
    from pyroaring import BitMap

    magic, count = struct.unpack_from("<iq", data, 0)
    if magic != MAGIC:
        raise ValueError(f"not a deletion vector bitmap (magic {magic})")
    out = BitMap()
    at = 12
    for _ in range(count):
        (high,) = struct.unpack_from("<i", data, at)
        at += 4
        part = BitMap.deserialize(data[at:])
        if high != 0 and len(part):
            raise ValueError("a deletion vector with row indexes past 2**32")
        at += len(part.serialize())  # (portable: the same containers, the same size)
        out |= part
    return out


def read_from_file(content: bytes, descriptor: Mapping[str, Any]) -> Any:
    """The row indexes a `u`/`p` descriptor names in its file's `content` (size and CRC-32 checked)."""
    at = int(descriptor.get("offset") or 1)
    (size,) = struct.unpack_from(">i", content, at)
    data = content[at + 4:at + 4 + size]
    (crc,) = struct.unpack_from(">I", content, at + 4 + size)
    if size != int(descriptor["sizeInBytes"]) or zlib.crc32(data) != crc:
        raise ValueError("a deletion vector whose size or checksum does not match its descriptor")
    return deserialize(data)


def read_inline(descriptor: Mapping[str, Any]) -> Any:
    data = z85_decode(str(descriptor["pathOrInlineDv"]))
    return deserialize(data[:int(descriptor["sizeInBytes"])])


def build_file(bitmaps: Sequence[Any], file_id: uuid.UUID) -> tuple[bytes, list[dict[str, Any]]]:
    """A deletion-vector file holding `bitmaps` (pyroaring BitMaps) and each one's `u` descriptor."""
    out = bytearray([FILE_VERSION])
    descriptors = []
    encoded = z85_encode(file_id.bytes)
    for rows in bitmaps:
        data = serialize(rows)
        descriptors.append({"storageType": "u", "pathOrInlineDv": encoded, "offset": len(out),
                            "sizeInBytes": len(data), "cardinality": len(rows)})
        out += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    return bytes(out), descriptors
