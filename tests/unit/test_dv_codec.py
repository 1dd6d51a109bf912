"""Delta's deletion vectors as bytes (merge/dv_codec.py): Z85, the bitmap, the file and its descriptors. What
Spark writes is read in tests/integration/test_in_process_deletion_vectors.py (a gold table Spark merged with
deletion vectors, merged again here), and what is written here is read there by Spark and delta-rs."""
from __future__ import annotations

import struct
import uuid
import zlib

import pytest
from pyroaring import BitMap

from slotlake.merge import dv_codec

pytestmark = pytest.mark.unit


def test_z85_is_the_spec_alphabet():
    # ZeroMQ RFC 32's test vector
    data = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert dv_codec.z85_encode(data) == "HelloWorld"
    assert dv_codec.z85_decode("HelloWorld") == data
    with pytest.raises(ValueError):
        dv_codec.z85_encode(b"abc")


def test_a_file_of_vectors_reads_back_through_its_descriptors():
    file_id = uuid.UUID("1f4f77a5-e585-42eb-ae68-6786f43ca9c2")
    vectors = [BitMap([0, 5, 70_000, 4_000_000]), BitMap(range(0, 100_000, 3)), BitMap([7])]
    content, descriptors = dv_codec.build_file(vectors, file_id)
    assert content[0] == 1
    assert [d["cardinality"] for d in descriptors] == [4, 33_334, 1]
    assert descriptors[0]["offset"] == 1
    assert descriptors[1]["offset"] == 1 + 4 + descriptors[0]["sizeInBytes"] + 4
    for rows, d in zip(vectors, descriptors):
        assert d["storageType"] == "u" and len(d["pathOrInlineDv"]) == 20
        assert dv_codec.relative_path(d) == f"deletion_vector_{file_id}.bin"
        assert dv_codec.read_from_file(content, d) == rows
    # the bitmap: magic, one 32-bit bitmap with high bits 0, Roaring's portable format
    at = descriptors[2]["offset"]
    size = struct.unpack_from(">i", content, at)[0]
    data = content[at + 4:at + 4 + size]
    assert struct.unpack_from("<iqi", data) == (dv_codec.MAGIC, 1, 0)
    assert BitMap.deserialize(data[16:]) == BitMap([7])
    assert struct.unpack_from(">I", content, at + 4 + size)[0] == zlib.crc32(data)


def test_a_damaged_vector_is_refused():
    content, (d,) = dv_codec.build_file([BitMap([1, 2, 3])], uuid.uuid4())
    broken = bytearray(content)
    broken[-5] ^= 0xFF  # a bitmap byte: the CRC no longer matches
    with pytest.raises(ValueError, match="checksum"):
        dv_codec.read_from_file(bytes(broken), d)
    with pytest.raises(ValueError, match="magic"):
        dv_codec.deserialize(b"\0" * 16)


def test_a_prefixed_path_and_an_inline_vector():
    file_id = uuid.uuid4()
    encoded = dv_codec.z85_encode(file_id.bytes)
    assert dv_codec.relative_path({"storageType": "u", "pathOrInlineDv": "ab" + encoded}) == \
        f"ab/deletion_vector_{file_id}.bin"
    data = dv_codec.serialize(BitMap([3, 9]))
    padded = data + b"\0" * (-len(data) % 4)
    inline = {"storageType": "i", "pathOrInlineDv": dv_codec.z85_encode(padded), "sizeInBytes": len(data)}
    assert dv_codec.read_inline(inline) == BitMap([3, 9])
    assert dv_codec.deserialize(dv_codec.serialize(BitMap())) == BitMap()
