"""Joining CRC-32s: the CRC of ``a + b`` from the CRCs of ``a`` and ``b`` and ``len(b)``.

A checkpoint's body CRC covers the ``ns_buffer`` and then each field's undo rows, in that
order, but the undo rows are copied ahead, a block at a time while adds go on (``undocopy.py``),
before the ``ns_buffer`` they follow is known. Each field's region keeps its own running CRC,
and the flush joins them::

    crc(a + b) == join(crc(a), crc(b), len(b))

zlib has this (``crc32_combine``) but Python's ``zlib`` does not expose it. The arithmetic is
that of zlib's: CRCs are polynomials over GF(2) modulo zlib's (bit-reflected), and appending
``n`` bytes to ``a`` multiplies its CRC by ``x**(8n)`` (``shift(n)``). In C where ``_rows``
is built (``_rows.crc_join``, about a microsecond), else here in Python: a millisecond the
first time a length is joined, then four table lookups (``_tables``, kept per length).
"""
from __future__ import annotations

from functools import lru_cache

__all__ = ["join", "join_python", "shift"]

from .. import native

_c_join = None if native.rows is None else native.rows.crc_join  # else the Python arithmetic below

_POLY = 0xEDB88320  # zlib's CRC-32 polynomial, bit-reflected
_ONE = 1 << 31  # x**0 in the reflected order (bit 31 holds the lowest power)


def _times(a: int, b: int) -> int:
    """``a * b`` modulo the polynomial (both reflected)."""
    product = 0
    m = _ONE
    while m:
        if a & m:
            product ^= b
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
        m >>= 1
    return product


@lru_cache(maxsize=1)
def _powers() -> list[int]:
    """``x**(2**k)`` for k = 0..63 (computed at the first use: never where the C join serves)."""
    out = [_ONE >> 1]  # x**1
    for _ in range(63):
        out.append(_times(out[-1], out[-1]))
    return out


def shift(nbytes: int) -> int:
    """``x**(8 * nbytes)`` modulo the polynomial: the factor ``join`` applies for ``nbytes``."""
    if nbytes < 0:
        raise ValueError(f"shift: nbytes must be >= 0, got {nbytes}")
    powers, factor, k, n = _powers(), _ONE, 3, nbytes  # x**(8n) = x**(n * 2**3)
    while n:
        if n & 1:
            factor = _times(powers[k], factor)
        n >>= 1
        k += 1
    return factor


@lru_cache(maxsize=256)
def _tables(nbytes: int) -> tuple:
    """Multiplication by ``shift(nbytes)`` as four tables, one per byte of the other factor
    (it is linear in it). Kept per length: a store's flushes join the same few lengths (each
    field's reserve), so after the first a join is four lookups, not 32 steps of ``_times``."""
    images, b = [], shift(nbytes)  # images[j]: the product for bit 31 - j (x**j) of the other factor
    for _ in range(32):
        images.append(b)
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    tables = []
    for k in range(4):  # bits 8k .. 8k + 7
        table = [0] * 256
        for i in range(8):
            bit, image = 1 << i, images[31 - 8 * k - i]
            for v in range(bit):
                table[v | bit] = table[v] ^ image
        tables.append(table)
    return tuple(tables)


def join_python(crc_a: int, crc_b: int, nbytes: int) -> int:
    """The CRC-32 of ``a + b``, where ``nbytes = len(b)``."""
    t0, t1, t2, t3 = _tables(nbytes)
    return t0[crc_a & 0xFF] ^ t1[(crc_a >> 8) & 0xFF] ^ t2[(crc_a >> 16) & 0xFF] ^ t3[(crc_a >> 24) & 0xFF] ^ crc_b


join = join_python if _c_join is None else _c_join
