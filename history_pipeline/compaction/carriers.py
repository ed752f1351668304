"""Supercolumn values on their way through Spark: Arrow "carrier" types Spark can hold.

Spark moves supercolumn values between stages (union, window, sort) without ever
interpreting them, so each value travels in a physical Arrow type Spark's Arrow
bridge accepts: UUIDs as binary, JSON as text, times and timestamps as int64
microseconds, dates as int32 days; numbers, text, binary, exact decimals, structs
and lists as they are. Both directions are vectorized Arrow casts, exact.
"""

from __future__ import annotations

import pyarrow as pa


def carrier_type(t: pa.DataType) -> pa.DataType:
    """The Spark-safe physical type that carries values of Arrow type ``t`` losslessly."""
    if isinstance(t, pa.BaseExtensionType):
        return carrier_type(t.storage_type)
    if pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_timestamp(t) or pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_date32(t):
        return pa.int32()
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(carrier_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, carrier_type(f.type)) for f in t])
    return t


def _null_mask(arr: pa.Array) -> pa.Array | None:
    return arr.is_null() if arr.null_count else None


def to_carrier(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """Values of Arrow type ``t`` in their carrier type."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(t, pa.BaseExtensionType):
        storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
        return to_carrier(storage, t.storage_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        values = to_carrier(arr.values, t.value_type)
        offsets = arr.offsets
        out = pa.ListArray.from_arrays(offsets.cast(pa.int32()), values, mask=_null_mask(arr))
        return out.cast(carrier_type(t)) if out.type != carrier_type(t) else out
    if pa.types.is_struct(t):
        fields = [to_carrier(arr.field(i), f.type) for i, f in enumerate(t)]
        return pa.StructArray.from_arrays(fields, fields=list(carrier_type(t)), mask=_null_mask(arr))
    target = carrier_type(t)
    return arr if arr.type == target else arr.cast(target)


def from_carrier(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """Carrier values (as Spark hands them back) in their real Arrow type ``t``."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(t, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(t, from_carrier(arr, t.storage_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if pa.types.is_large_list(arr.type):
            arr = arr.cast(pa.list_(arr.type.value_type))
        values = from_carrier(arr.values, t.value_type)
        return pa.ListArray.from_arrays(arr.offsets, values, type=t, mask=_null_mask(arr))
    if pa.types.is_struct(t):
        fields = [from_carrier(arr.field(i), f.type) for i, f in enumerate(t)]
        return pa.StructArray.from_arrays(fields, fields=list(t), mask=_null_mask(arr))
    if arr.type == t:
        return arr
    if pa.types.is_fixed_size_binary(t) and not pa.types.is_binary(arr.type):
        arr = arr.cast(pa.binary())
    return arr.cast(t)
