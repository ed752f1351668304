"""Parquet split-block Bloom filters on the key column: which row groups may hold a key.

A closed file's row groups are cut by time (``closed_layout``), so under updates that arrive in
random key order each row group spans nearly the whole key range and its statistics rule no key
out. Those files (``supertable.time_cut``: version files, snapshot pieces holding versions, and
snapshot pieces whose rows superseded in the interval are bucketed by time) carry a Bloom filter
on ``synthetic_key`` per row group (written by pyarrow, read by DuckDB for ``row_history``'s scan);
a point lookup checks them itself: a file's filters are read in one request on its first lookup
and kept (``supertable.read.KeyBlooms``), and a key is tested against the one 32-byte block of
each that it hashes to, every row group of a file at once. The hash and the block layout are the
Parquet format's (xxHash64 of the value's plain encoding, eight salted bits in one block); the
tests check them against filters pyarrow wrote and against the format's algorithm written out
one block at a time.
"""

from __future__ import annotations

import functools

import numpy as np

_MASK64 = (1 << 64) - 1
_P1 = 11400714785074694791
_P2 = 14029467366897019727
_P3 = 1609587929392839161
_P4 = 9650029242287828579
_P5 = 2870177450012600261
#: the Parquet SBBF salts, one per 32-bit word of a block
SALT = (0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31)
BLOCK_BYTES = 32


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (64 - bits))) & _MASK64


def xxh64_int64(value: int) -> int:
    """xxHash64 (seed 0) of ``value``'s 8-byte little-endian two's complement encoding."""
    lane = value & _MASK64
    h = (_P5 + 8) & _MASK64
    k1 = (_rotl((lane * _P2) & _MASK64, 31) * _P1) & _MASK64
    h ^= k1
    h = (_rotl(h, 27) * _P1 + _P4) & _MASK64
    h ^= h >> 33
    h = (h * _P2) & _MASK64
    h ^= h >> 29
    h = (h * _P3) & _MASK64
    return h ^ (h >> 32)


def bitset_bytes(filter_length: int) -> int:
    """The bitset's size in a filter of ``filter_length`` bytes (its header, a few bytes, comes
    first; the bitset is a power of two of at least a block, so it is the largest one that fits)."""
    return 1 << (filter_length.bit_length() - 1)


@functools.lru_cache(maxsize=4096)
def hashed_key(key: int) -> tuple[int, np.ndarray]:
    """What a filter check needs of ``key``: its hash's high half (which picks the block) and the
    eight 32-bit words of the bits it sets in that block. Cached: a key history or a lookup checks
    one key against the filters of many files."""
    key_hash = xxh64_int64(key)
    low = key_hash & 0xFFFFFFFF
    bits = np.array([1 << (((low * salt) & 0xFFFFFFFF) >> 27) for salt in SALT], dtype=np.uint32)
    bits.flags.writeable = False
    return key_hash >> 32, bits
