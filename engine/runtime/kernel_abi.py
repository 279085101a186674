"""The structs the native forward is handed (engine/runtime/tandem_abi.h) as ctypes mirrors
them, and the check that a loaded kernel library was built with the same layout.

Why checked at load: the layouts are written twice, in C and here, and a field added, moved or
resized on one side only would have the forward read another field's bytes, without an error.
The library reports its ABI version, its structs' sizes and every field's offset
(`tandem_abi()`); int8_kernel.py compares them with these structs once, when it loads the
library, and refuses one that differs in any, saying which (`mismatch`): torch then does the
work, as where no library is there at all.
"""
from __future__ import annotations

import ctypes

# The version of tandem_abi.h's structs these mirror: bump both with any change to them.
ABI_VERSION = 5


class Int8Struct(ctypes.Structure):
    _fields_ = [("weight", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("row_sums", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("rows", ctypes.c_int64), ("width", ctypes.c_int64),
                ("packed", ctypes.c_void_p), ("group_scales", ctypes.c_void_p)]


class LayerStruct(ctypes.Structure):
    _fields_ = [("input_norm", ctypes.c_void_p), ("post_attention_norm", ctypes.c_void_p), ("qkv", Int8Struct),
                ("output", Int8Struct), ("gate_up", Int8Struct), ("down", Int8Struct), ("keys", ctypes.c_void_p), ("values", ctypes.c_void_p),
                ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p)]


class DecoderStruct(ctypes.Structure):
    _fields_ = [
        ("layers", ctypes.c_int64), ("hidden", ctypes.c_int64), ("heads", ctypes.c_int64), ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64), ("intermediate", ctypes.c_int64), ("vocab", ctypes.c_int64), ("cache_rows", ctypes.c_int64),
        ("eps", ctypes.c_float), ("attention_scale", ctypes.c_float),
        ("embedding", ctypes.c_void_p), ("embedding_scale", ctypes.c_void_p), ("final_norm", ctypes.c_void_p),
        ("lm_head", Int8Struct), ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("table_positions", ctypes.c_int64),
        ("layer", ctypes.POINTER(LayerStruct)),
    ]


# Each struct by its name in tandem_abi.h, in the order tandem_abi() reports them.
STRUCTS = {"TandemInt8": Int8Struct, "TandemLayer": LayerStruct, "TandemDecoder": DecoderStruct}


def expected_abi() -> list[tuple[str, int]]:
    """What a library of these structs reports, in tandem_abi()'s order, each with its name:
    the version, each struct's size, then each struct's fields' offsets."""
    layout = [("ABI version", ABI_VERSION)]
    layout += [(f"sizeof({name})", ctypes.sizeof(struct)) for name, struct in STRUCTS.items()]
    for name, struct in STRUCTS.items():
        layout += [(f"offsetof({name}, {field})", getattr(struct, field).offset) for field, _ in struct._fields_]
    return layout


def reported_abi(library: ctypes.CDLL) -> list[int]:
    """What `library` reports it was built with (tandem_abi()), in the order `expected_abi` names."""
    library.tandem_abi.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    library.tandem_abi.restype = ctypes.c_int64
    count = library.tandem_abi(None, 0)
    values = (ctypes.c_int64 * count)()
    library.tandem_abi(values, count)
    return list(values)


def mismatch(library: ctypes.CDLL) -> str | None:
    """Why `library`'s structs are not these, in words; None where they are the same."""
    if not hasattr(library, "tandem_abi"):
        return "the int8 kernel library reports no ABI version (built from older sources)"
    reported, expected = reported_abi(library), expected_abi()
    if reported[0] != ABI_VERSION:
        return f"the int8 kernel library has ABI version {reported[0]}; this Tandem reads {ABI_VERSION}"
    if len(reported) != len(expected):
        return (f"the int8 kernel library reports {len(reported)} ABI values where this Tandem's structs have "
                f"{len(expected)} (tandem_abi.h and engine/runtime/kernel_abi.py differ)")
    for (what, ours), theirs in zip(expected, reported):
        if ours != theirs:
            return (f"the int8 kernel library's {what} is {theirs} where this Tandem's ctypes structs have {ours} "
                    f"(tandem_abi.h and engine/runtime/kernel_abi.py differ)")
    return None
