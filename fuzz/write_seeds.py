#!/usr/bin/env python3
"""write_seeds.py: write seed corpora for the fuzz targets in fuzz/fuzz_targets/.

    python3 fuzz/write_seeds.py OUT_DIR [TARGET...]

writes a few small, valid inputs for each target (default: all of them) into
OUT_DIR/<target>/ (scripts/fuzz uses fuzz/corpus), so that libFuzzer starts from files the
readers accept instead of having to discover magic numbers and layouts itself:

    gguf_parse          GGUF v2 and v3: every metadata value type, nested arrays, every
                        GGML tensor type loupe reads, a custom general.alignment
    gguf_roundtrip      byte strings read as choices (every input describes a valid file)
    safetensors_parse   safetensors images (float, integer and bool dtypes, scalars,
                        empty tensors, __metadata__) and model.safetensors.index.json
    npy_parse           .npy 1.0/2.0/3.0, little and big endian, Fortran order, bool, V2
    npz_parse           .npz archives of those, stored and deflated members
    pt_parse            torch.save zip archives, their data.pkl assembled opcode by opcode
                        (protocol 2 as torch writes, and protocol 4 with frames and
                        STACK_GLOBAL); nothing is unpickled here
    max_parse           Modular MAX .max tensors of several dtypes and ranks
    openai_request      /v1/chat/completions, /v1/completions and /v1/embeddings bodies
    kv_block_parse      the prefix cache's disk-tier block files (f16, f32, FP8 payloads)
    compact_bpe         vocabularies (0xFF-separated tokens) and a text whose first byte
                        picks scored or listed merges

Python standard library only; the output is the same bytes on every run. Every layout
follows the reader in crates/loupe-formats (or loupe-server's request.rs) it seeds; a
seed a reader refuses still works as a seed, it only starts the fuzzer from less.
"""

import io
import json
import random
import struct
import sys
import zipfile
from pathlib import Path

# ---------------------------------------------------------------------------------------
# GGUF (ggml's gguf.h; crates/loupe-formats/src/gguf/reader.rs)

GGUF_U8, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL = range(8)
GGUF_STRING, GGUF_ARRAY, GGUF_U64, GGUF_I64, GGUF_F64 = range(8, 13)
SCALAR_FMT = {
    GGUF_U8: "<B", GGUF_I8: "<b", GGUF_U16: "<H", GGUF_I16: "<h", GGUF_U32: "<I",
    GGUF_I32: "<i", GGUF_F32: "<f", GGUF_BOOL: "<?", GGUF_U64: "<Q", GGUF_I64: "<q",
    GGUF_F64: "<d",
}

# name: (on-disk id, elements per block, bytes per block), loupe-core's GgmlType.
GGML_TYPES = {
    "f32": (0, 1, 4), "f16": (1, 1, 2), "q4_0": (2, 32, 18), "q4_1": (3, 32, 20),
    "q5_0": (6, 32, 22), "q5_1": (7, 32, 24), "q8_0": (8, 32, 34), "q8_1": (9, 32, 36),
    "q2_K": (10, 256, 84), "q3_K": (11, 256, 110), "q4_K": (12, 256, 144),
    "q5_K": (13, 256, 176), "q6_K": (14, 256, 210), "q8_K": (15, 256, 292),
    "bf16": (30, 1, 2), "mxfp4": (39, 32, 17), "nvfp4": (40, 64, 36),
    "fp8_e4m3": (1000, 32, 34),
}


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(ty, v):
    if ty == GGUF_STRING:
        return gguf_str(v)
    if ty == GGUF_ARRAY:
        elem, items = v
        return struct.pack("<IQ", elem, len(items)) + b"".join(gguf_value(elem, x) for x in items)
    return struct.pack(SCALAR_FMT[ty], v)


def f16_bits(x):
    return struct.pack("<e", x)


def tensor_bytes(type_name, n_elements, rng):
    """Data for a tensor; float types get real values, block types random bytes with a
    finite f16 scale in front of each block (the layout of most ggml blocks)."""
    _, block, size = GGML_TYPES[type_name]
    if type_name == "f32":
        return b"".join(struct.pack("<f", (i % 7) - 3.25) for i in range(n_elements))
    if type_name == "f16":
        return b"".join(f16_bits((i % 5) * 0.5) for i in range(n_elements))
    if type_name == "bf16":
        return b"".join(struct.pack("<f", (i % 3) - 1.0)[2:] for i in range(n_elements))
    out = b""
    for _ in range(n_elements // block):
        out += f16_bits(0.125) + bytes(rng.randrange(256) for _ in range(size - 2))
    return out


def gguf(kvs, tensors, version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, dims, type_name, data)], dims innermost
    first as GGUF stores them. Tensor data is laid out in order, each padded to the
    alignment, as ggml writes it."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, ty, v in kvs:
        out += gguf_str(key) + struct.pack("<I", ty) + gguf_value(ty, v)
    data = b""
    for name, dims, type_name, blob in tensors:
        out += gguf_str(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", GGML_TYPES[type_name][0], len(data))
        data += blob + bytes(-len(blob) % alignment)
    out += bytes(-len(out) % alignment)
    return out + data


def gguf_parse_seeds():
    rng = random.Random(1)
    tokens = ["<unk>", "<s>", "</s>", "a", "b", "ab", "\u00e9", "\u4e2d", " "]
    llama_kvs = [
        ("general.architecture", GGUF_STRING, "llama"),
        ("general.name", GGUF_STRING, "tiny seed"),
        ("general.file_type", GGUF_U32, 3),
        ("llama.context_length", GGUF_U32, 64),
        ("llama.embedding_length", GGUF_U32, 32),
        ("llama.block_count", GGUF_U32, 1),
        ("llama.attention.head_count", GGUF_U32, 2),
        ("llama.attention.layer_norm_rms_epsilon", GGUF_F32, 1e-5),
        ("llama.rope.freq_base", GGUF_F32, 10000.0),
        ("tokenizer.ggml.model", GGUF_STRING, "gpt2"),
        ("tokenizer.ggml.tokens", GGUF_ARRAY, (GGUF_STRING, tokens)),
        ("tokenizer.ggml.scores", GGUF_ARRAY, (GGUF_F32, [float(-i) for i in range(len(tokens))])),
        ("tokenizer.ggml.token_type", GGUF_ARRAY, (GGUF_I32, [1] * len(tokens))),
        ("tokenizer.ggml.merges", GGUF_ARRAY, (GGUF_STRING, ["a b"])),
        ("tokenizer.ggml.bos_token_id", GGUF_U32, 1),
        ("tokenizer.ggml.add_bos_token", GGUF_BOOL, True),
    ]
    llama_tensors = []
    for name, dims, ty in [
        ("token_embd.weight", [32, 9], "q4_1"),
        ("blk.0.attn_norm.weight", [32], "f32"),
        ("blk.0.attn_q.weight", [32, 32], "q8_0"),
        ("blk.0.ffn_down.weight", [256, 1], "q4_K"),
        ("blk.0.ffn_up.weight", [256, 1], "q6_K"),
        ("output_norm.weight", [32], "f16"),
        ("output.weight", [32, 2], "bf16"),
    ]:
        n = 1
        for d in dims:
            n *= d
        llama_tensors.append((name, dims, ty, tensor_bytes(ty, n, rng)))

    every_value = [
        ("u8", GGUF_U8, 255), ("i8", GGUF_I8, -128), ("u16", GGUF_U16, 65535),
        ("i16", GGUF_I16, -32768), ("u32", GGUF_U32, 2**32 - 1), ("i32", GGUF_I32, -(2**31)),
        ("f32", GGUF_F32, -0.0), ("bool", GGUF_BOOL, False), ("string", GGUF_STRING, "\"q\"\\\n\0"),
        ("u64", GGUF_U64, 2**64 - 1), ("i64", GGUF_I64, -(2**63)), ("f64", GGUF_F64, float("inf")),
        ("empty_string", GGUF_STRING, ""),
        ("array.u8", GGUF_ARRAY, (GGUF_U8, [0, 1, 2])),
        ("array.f64", GGUF_ARRAY, (GGUF_F64, [0.5, float("nan")])),
        ("array.bool", GGUF_ARRAY, (GGUF_BOOL, [True, False])),
        ("array.empty", GGUF_ARRAY, (GGUF_I64, [])),
        ("array.nested", GGUF_ARRAY, (GGUF_ARRAY, [(GGUF_U16, [1, 2]), (GGUF_STRING, ["x", "yz"])])),
        ("general.alignment", GGUF_U32, 64),
    ]
    one_of_each = []
    for i, (ty, (_, block, _)) in enumerate(GGML_TYPES.items()):
        dims = [block * (2 if block == 1 else 1), 2] if i % 2 else [block]
        n = dims[0] * (dims[1] if len(dims) > 1 else 1)
        one_of_each.append((f"t.{ty}", dims, ty, tensor_bytes(ty, n, rng)))

    return {
        "llama_v3.gguf": gguf(llama_kvs, llama_tensors),
        "every_value_type_align64.gguf": gguf(
            every_value, [("x", [4, 3, 2, 1], "f32", tensor_bytes("f32", 24, rng))], alignment=64
        ),
        "every_ggml_type.gguf": gguf([("general.architecture", GGUF_STRING, "test")], one_of_each),
        "v2_metadata_only.gguf": gguf([("general.architecture", GGUF_STRING, "gpt2")], [], version=2),
        "empty.gguf": gguf([], []),
    }


def gguf_roundtrip_seeds():
    # The target reads its input as a stream of choices (loupe_formats::fuzzing::Choices):
    # any bytes describe a valid file, so seeds are just bytes of a few lengths.
    rng = random.Random(2)
    seeds = {"zeros_64": bytes(64), "ones_64": b"\x01" * 64, "ascending_256": bytes(range(256))}
    for n in (8, 32, 128, 512, 2048):
        seeds[f"random_{n}"] = bytes(rng.randrange(256) for _ in range(n))
    return seeds


# ---------------------------------------------------------------------------------------
# safetensors (the safetensors README; crates/loupe-formats/src/safetensors_file/)

ST_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
           "U8": 1, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, data)], laid out in order."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


def st_data(dtype, shape, rng):
    n = 1
    for d in shape:
        n *= d
    if dtype == "F32":
        return b"".join(struct.pack("<f", i * 0.5 - 1) for i in range(n))
    if dtype == "F16":
        return b"".join(f16_bits(i * 0.25) for i in range(n))
    if dtype == "BF16":
        return b"".join(struct.pack("<f", i - 2.0)[2:] for i in range(n))
    if dtype == "BOOL":
        return bytes(i % 2 for i in range(n))
    return bytes(rng.randrange(256) for _ in range(n * ST_SIZE[dtype]))


def safetensors_parse_seeds():
    rng = random.Random(3)
    model = [
        ("model.embed_tokens.weight", "BF16", [4, 3]),
        ("model.layers.0.input_layernorm.weight", "F32", [3]),
        ("model.layers.0.self_attn.q_proj.weight", "F16", [3, 3]),
        ("lm_head.weight", "F32", [4, 3]),
    ]
    dtypes = [(f"t.{d.lower()}", d, [2, 2]) for d in ST_SIZE]
    odd = [("scalar", "F32", []), ("empty", "F16", [0]), ("empty_2d", "BF16", [3, 0]),
           ("ids", "I64", [5]), ("mask", "BOOL", [1, 1, 4])]

    def build(entries, metadata=None):
        return safetensors([(n, d, s, st_data(d, s, rng)) for n, d, s in entries], metadata)

    index = {
        "metadata": {"total_size": 1234},
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        },
    }
    return {
        "model_pt_metadata.safetensors": build(model, {"format": "pt"}),
        "every_dtype.safetensors": build(dtypes),
        "scalar_empty_bool.safetensors": build(odd, {"a": "1", "b": ""}),
        "empty.safetensors": build([]),
        "model.safetensors.index.json": json.dumps(index, indent=2).encode(),
    }


# ---------------------------------------------------------------------------------------
# npy / npz (numpy/lib/format.py; crates/loupe-formats/src/npy.rs, npz.rs)

def npy(descr, shape, data, fortran=False, version=(1, 0)):
    shape_text = "()" if not shape else "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape_text)
    hb = header.encode("utf-8")
    len_size = 2 if version == (1, 0) else 4
    pre = 6 + 2 + len_size
    hb += b" " * (-(pre + len(hb) + 1) % 64) + b"\n"
    head = b"\x93NUMPY" + bytes(version) + struct.pack("<H" if len_size == 2 else "<I", len(hb))
    return head + hb + data


def npy_seeds():
    f32 = b"".join(struct.pack("<f", v) for v in (1.0, -2.0, 3.5, 0.0, 5.0, 6.0))
    return {
        "f32_2x3.npy": npy("<f4", [2, 3], f32),
        "f32_big_endian.npy": npy(">f4", [3], b"".join(struct.pack(">f", v) for v in (1.0, 2.0, -0.5))),
        "f16_v2.npy": npy("<f2", [4], b"".join(f16_bits(v) for v in (0.5, 1.0, -1.5, 65504.0)), version=(2, 0)),
        "i64_fortran_3x2.npy": npy("<i8", [3, 2], b"".join(struct.pack("<q", v) for v in range(6)), fortran=True),
        "bool_2x2.npy": npy("|b1", [2, 2], bytes([1, 0, 0, 1])),
        "u8_utf8_v3.npy": npy("|u1", [5], bytes(range(5)), version=(3, 0)),
        "bf16_bits_v2.npy": npy("|V2", [2, 2], b"".join(struct.pack("<f", v)[2:] for v in (1.0, 2.0, 3.0, 4.0))),
        "u16_3.npy": npy("<u2", [3], struct.pack("<3H", 16256, 16384, 0)),
        "scalar_f64.npy": npy("<f8", [], struct.pack("<d", 3.25)),
        "empty_i32.npy": npy("<i4", [0, 4], b""),
        "i16_rank4.npy": npy("<i2", [1, 2, 1, 2], struct.pack("<4h", -1, 2, -3, 4)),
    }


def zip_of(members):
    """members: [(name, bytes, deflate)]."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data, deflate in members:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
            z.writestr(info, data)
    return buf.getvalue()


def npz_seeds():
    a = npy_seeds()
    return {
        "stored.npz": zip_of([("a.npy", a["f32_2x3.npy"], False), ("b.npy", a["bool_2x2.npy"], False)]),
        "deflated.npz": zip_of([("x.npy", a["f16_v2.npy"], True), ("y.npy", a["i64_fortran_3x2.npy"], True)]),
        "mixed.npz": zip_of([(n[:-4].replace("_", "") + ".npy", b, i % 2 == 1) for i, (n, b) in enumerate(a.items())]),
        "empty.npz": zip_of([]),
    }


# ---------------------------------------------------------------------------------------
# torch.save (.pt): a zip whose <folder>/data.pkl is a pickle naming storages in
# <folder>/data/<key> (crates/loupe-formats/src/pt.rs, pickle.rs). The pickles are
# assembled from opcodes, the same ones `pickletools.dis` shows for torch.save output.

def p_unicode(s):  # BINUNICODE
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def p_int(v):
    if 0 <= v < 256:
        return b"K" + bytes([v])  # BININT1
    if 0 <= v < 65536:
        return b"M" + struct.pack("<H", v)  # BININT2
    return b"J" + struct.pack("<i", v)  # BININT


def p_tuple(items):
    if 1 <= len(items) <= 3:
        return b"".join(items) + bytes([0x84 + len(items)])  # TUPLE1..3
    return b"(" + b"".join(items) + b"t"  # MARK ... TUPLE


class Pickle2:
    """Protocol 2 as torch.save writes it: GLOBAL by name, BINPUT after each object."""

    def __init__(self):
        self.memo = 0

    def put(self):
        self.memo += 1
        return b"q" + bytes([self.memo - 1])

    def tensor(self, storage_class, key, numel, offset, shape, strides, parameter=False):
        out = b"ctorch._utils\n_rebuild_tensor_v2\n" + self.put()
        pid = p_tuple([p_unicode("storage"), b"ctorch\n" + storage_class.encode() + b"\n",
                       p_unicode(key), p_unicode("cpu"), p_int(numel)])
        args = [pid + b"Q", p_int(offset), p_tuple([p_int(d) for d in shape]),
                p_tuple([p_int(s) for s in strides]), b"\x89",  # requires_grad False
                b"ccollections\nOrderedDict\n)R"]  # backward hooks: OrderedDict()
        out += b"(" + b"".join(args) + b"t" + b"R" + self.put()
        if parameter:
            out = b"ctorch._utils\n_rebuild_parameter\n" + out + b"\x88" + b"ccollections\nOrderedDict\n)R" + b"\x87R"
        return out

    def state_dict(self, entries):
        """entries: [(name, tensor opcodes)] in an OrderedDict, as model.state_dict()."""
        out = b"ccollections\nOrderedDict\n)R" + self.put() + b"("
        for name, t in entries:
            out += p_unicode(name) + t
        return b"\x80\x02" + out + b"u."


def pickle4_state_dict():
    """Protocol 4 style (FRAME, SHORT_BINUNICODE, STACK_GLOBAL, MEMOIZE, EMPTY_DICT):
    {"w": tensor_v3(float16, 2x2), "list": [tensor(int64, 3)], "meta": 7}."""

    def sbu(s):
        b = s.encode()
        return b"\x8c" + bytes([len(b)]) + b

    def glob(module, name):
        return sbu(module) + sbu(name) + b"\x93\x94"

    def v3_tensor(storage_key, numel, shape, strides, dtype):
        pid = (b"(" + sbu("storage") + glob("torch.storage", "UntypedStorage") + sbu(storage_key)
               + sbu("cpu") + p_int(numel) + b"t\x94")
        return (glob("torch._utils", "_rebuild_tensor_v3") + b"(" + pid + b"Q\x94" + p_int(0)
                + p_tuple([p_int(d) for d in shape]) + p_tuple([p_int(s) for s in strides]) + b"\x89"
                + glob("collections", "OrderedDict") + b")R\x94" + glob("torch", dtype) + b"t\x94R\x94")

    body = (b"}\x94(" + sbu("w") + v3_tensor("0", 8, [2, 2], [2, 1], "float16")
            + sbu("list") + b"]\x94" + v3_tensor("1", 24, [3], [1], "int64") + b"a"
            + sbu("meta") + p_int(7) + b"u.")
    return b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body


def torch_zip(folder, pkl, storages, big_endian=False):
    members = [(f"{folder}/data.pkl", pkl, False), (f"{folder}/byteorder", b"big" if big_endian else b"little", False)]
    members += [(f"{folder}/data/{k}", v, False) for k, v in storages.items()]
    members += [(f"{folder}/version", b"3\n", False), (f"{folder}/.data/serialization_id", b"0123456789", False)]
    return zip_of(members)


def pt_seeds():
    f32 = lambda vals: b"".join(struct.pack("<f", v) for v in vals)
    single = Pickle2()
    single_pkl = b"\x80\x02" + single.tensor("FloatStorage", "0", 2, 0, [2], [1]) + b"."

    sd = Pickle2()
    entries = [
        ("embed.weight", sd.tensor("FloatStorage", "0", 6, 0, [3, 2], [2, 1])),
        # a transposed view of the same storage, and a slice at an offset
        ("embed.weight_t", sd.tensor("FloatStorage", "0", 6, 0, [2, 3], [1, 2])),
        ("row", sd.tensor("FloatStorage", "0", 6, 4, [2], [1])),
        ("norm.weight", sd.tensor("HalfStorage", "1", 3, 0, [3], [1], parameter=True)),
        ("proj.weight", sd.tensor("BFloat16Storage", "2", 4, 0, [2, 2], [2, 1])),
        ("step", sd.tensor("LongStorage", "3", 1, 0, [], [])),
        ("mask", sd.tensor("BoolStorage", "4", 2, 0, [2], [1])),
    ]
    sd_pkl = sd.state_dict(entries)
    sd_storages = {
        "0": f32([1, 2, 3, 4, 5, 6]),
        "1": b"".join(f16_bits(v) for v in (1.0, 0.5, 2.0)),
        "2": b"".join(struct.pack("<f", v)[2:] for v in (1.0, -1.0, 0.25, 8.0)),
        "3": struct.pack("<q", 1000),
        "4": bytes([1, 0]),
    }
    big = Pickle2()
    big_pkl = b"\x80\x02" + big.tensor("IntStorage", "0", 3, 0, [3], [1]) + b"."
    p4_storages = {"0": b"".join(f16_bits(v) for v in (1, 2, 3, 4)), "1": struct.pack("<3q", -1, 0, 1)}
    return {
        "tensor.pt": torch_zip("t", single_pkl, {"0": f32([1.0, 2.0])}),
        "state_dict.pt": torch_zip("archive", sd_pkl, sd_storages),
        "big_endian_i32.pt": torch_zip("b", big_pkl, {"0": struct.pack(">3i", 1, -2, 3)}, big_endian=True),
        "protocol4_v3.pt": torch_zip("archive", pickle4_state_dict(), p4_storages),
    }


# ---------------------------------------------------------------------------------------
# .max (docs/dump-format.md, "The .max file"; crates/loupe-formats/src/max_file.rs)

MAX_MAGIC = bytes([0x93, 0xF0, 0x9F, 0x94, 0xA5, 0x2B, 0x2B, 0x93])


def max_file(key, code, shape, data, minor=1):
    k = key.encode()
    meta = 4 + len(k) + 2 + 4 * len(shape) + 8
    out = MAX_MAGIC + struct.pack("<IIQI", 0, minor, meta, len(k)) + k + bytes([code, len(shape)])
    out += b"".join(struct.pack("<I", d) for d in shape) + struct.pack("<Q", 24 + meta)
    return out + data


def max_seeds():
    return {
        "f32_output.max": max_file("x-output", 81, [2], struct.pack("<2f", 1.0, 2.0)),
        "bf16_2x2.max": max_file("model.layers.0.mlp-input", 80, [2, 2], struct.pack("<4H", 0x3F80, 0x4000, 0xBF80, 0)),
        "f16_minor7.max": max_file("h", 79, [3], b"".join(f16_bits(v) for v in (1, 2, 3)), minor=7),
        "i64_rank3.max": max_file("ids", 141, [1, 1, 3], struct.pack("<3q", 1, 2, -3)),
        "bool.max": max_file("mask", 1, [4], bytes([1, 0, 1, 1])),
        "f8e4m3_scalar.max": max_file("s\u00e9_\u4e2d", 75, [], b"\x38"),
        "u8_empty.max": max_file("", 134, [0], b""),
        "f64.max": max_file("d", 82, [1], struct.pack("<d", -0.0)),
    }


# ---------------------------------------------------------------------------------------
# OpenAI-compatible request bodies (crates/loupe-server/src/request.rs)

def openai_seeds():
    bodies = {
        "chat_minimal.json": {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
        "chat_sampling_stream.json": {
            "model": "smollm2", "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}],
            "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "stop": ["\n", "END"],
            "logprobs": True, "top_logprobs": 3, "stream": True, "stream_options": {"include_usage": True},
            "seed": -3, "max_completion_tokens": 40, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "repetition_penalty": 1.1, "n": 1, "user": "u", "metadata": {"a": "b"}, "store": False,
        },
        "chat_tools.json": {
            "messages": [
                {"role": "system", "content": "Use tools."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                      "required": ["city"]}}},
                      {"type": "function", "function": {"name": "now"}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False,
        },
        "chat_json_schema.json": {
            "model": "m", "messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 64,
            "response_format": {"type": "json_schema", "json_schema": {"name": "out", "strict": True, "schema": {
                "type": "object", "properties": {"n": {"type": "integer"}, "tags": {"type": "array",
                "items": {"type": "string"}}}, "required": ["n"], "additionalProperties": False}}},
            "tool_choice": "none", "tools": [],
        },
        "chat_json_object.json": {"messages": [{"role": "user", "content": "x"}],
                                  "response_format": {"type": "json_object"}, "ignore_eos": True, "stop": "."},
        "completion_text.json": {"model": "m", "prompt": "Once upon a time", "max_tokens": 16, "logprobs": 2,
                                 "echo": False, "suffix": None, "best_of": 1, "stream": False},
        "completion_tokens.json": {"prompt": [1, 2, 3, 4294967295], "top_k": -1, "min_p": 0.1,
                                   "temperature": 0, "seed": 42},
        "completion_nested_tokens.json": {"prompt": [[5, 6, 7]], "max_tokens": 1, "stop": ["a", "b", "c", "d"]},
        "completion_one_string.json": {"prompt": ["Hello"], "response_format": {"type": "text"}},
        "embeddings_string.json": {"model": "all-minilm-l6-v2", "input": "a sentence"},
        "embeddings_batch_base64.json": {"input": ["one", "two", "\u00e9\u4e2d"], "encoding_format": "base64",
                                         "dimensions": 384, "user": "u"},
    }
    seeds = {name: json.dumps(body, ensure_ascii=False).encode() for name, body in bodies.items()}
    seeds["empty_object.json"] = b"{}"
    return seeds


# ---------------------------------------------------------------------------------------
# Prefix-cache block files (crates/loupe-runtime/src/batch/disk/format.rs)


def kv_block(dtype, layers, width, block, seed):
    """One block file: header, token ids, payload (per layer keys then values), CRC-32."""
    import zlib
    rng = random.Random(seed)
    if dtype == 2:  # fp8_e4m3: codes, then one f32 scale per group of 32/16/8 (else the row)
        group = next((g for g in (32, 16, 8) if width % g == 0), width)
        row = width + 4 * (width // group)
    else:
        row = width * (2 if dtype == 0 else 4)
    payload_len = layers * 2 * block * row
    head = b"LOUPEKVB" + struct.pack("<IB3x", 1, dtype)
    head += struct.pack("<QQ", rng.getrandbits(64), rng.getrandbits(64))
    prompt = rng.randrange(block + 1)
    head += struct.pack("<IIII", layers, width, block, prompt)
    head += struct.pack("<QQQ", rng.getrandbits(64), rng.getrandbits(64), payload_len)
    tokens = b"".join(struct.pack("<I", rng.randrange(1 << 17)) for _ in range(block))
    body = head + tokens + bytes(rng.randrange(256) for _ in range(payload_len))
    return body + struct.pack("<I", zlib.crc32(body))


def kv_block_seeds():
    return {
        "f16_2x8x4.kvb": kv_block(0, 2, 8, 4, 1),
        "f32_1x4x2.kvb": kv_block(1, 1, 4, 2, 2),
        "fp8_3x32x2.kvb": kv_block(2, 3, 32, 2, 3),
        "fp8_odd_width.kvb": kv_block(2, 1, 12, 1, 4),
    }


def compact_bpe_seeds():
    def seed(tokens, text):
        return b"\xff".join(t.encode() for t in tokens) + b"\xff" + text.encode()

    pieces = ["<unk>", "<0x61>", "<0xC3>", "<0xA9>", "a", "b", "c", "\u2581", "ab", "bc", "abc", "\u2581a"]
    return {
        "letters.bin": seed(pieces, "abc cab \u2581abcabc"),
        "bytes_and_unk.bin": seed(pieces, "\u00e9\u732b\u00dfa \u00e9\u00e9"),
        "duplicates.bin": seed(["a", "b", "ab", "ab", "b", "ba"], "abab baba"),
        "listed.bin": seed(pieces, "babc cab abcabc"),
    }


SEEDS = {
    "gguf_parse": gguf_parse_seeds,
    "gguf_roundtrip": gguf_roundtrip_seeds,
    "safetensors_parse": safetensors_parse_seeds,
    "npy_parse": npy_seeds,
    "npz_parse": npz_seeds,
    "pt_parse": pt_seeds,
    "max_parse": max_seeds,
    "openai_request": openai_seeds,
    "kv_block_parse": kv_block_seeds,
    "compact_bpe": compact_bpe_seeds,
}


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = Path(argv[1])
    targets = argv[2:] or list(SEEDS)
    for t in targets:
        d = out / t
        d.mkdir(parents=True, exist_ok=True)
        if t not in SEEDS:
            # A new target still runs, from an empty corpus; add its seeds to SEEDS.
            print(f"{t}: no seeds in write_seeds.py (libFuzzer starts from an empty corpus)")
            continue
        seeds = SEEDS[t]()
        for name, data in seeds.items():
            (d / name).write_bytes(data)
        print(f"{t}: {len(seeds)} seeds in {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
