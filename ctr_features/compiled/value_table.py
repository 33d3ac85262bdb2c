"""(field, value) -> int lookups over a whole field-major batch of strings at once, in numpy.

A dict lookup per value is interpreter work for each of a Criteo row's 26 values; this module does the 26N
lookups of a batch in ~25 numpy passes. Every Criteo categorical is 8 hex characters or "" (missing), so a
value is keyed by its 8 bytes as one uint64; the keys of a batch are cut out of one join of all its values
(`RawKeys`), salted with the field and found in a cuckoo hash table built once (`ValueTable`), comparing
the whole key, so a lookup is exact. Batches holding values of other lengths, a NUL or 0x01 character, or a
string UTF-8 cannot hold, are looked up in the tables' dicts, value by value, and so are non-ASCII values:
the same answers, at the dicts' speed.

The keys are computed once per batch (`RawBatch.keys`) and shared by every table that looks the batch up:
the compiled FeatureSpec (ctr_features/compiled/table.py) and drift binning (serving/observability/drift.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

try:
    from ctr_features.compiled._table_native import keys as _native_keys
except ImportError:  # not built: the numpy join below keys batches of 0- and 8-byte values
    _native_keys = None

SHORT = 8  # bytes of a value that fit its uint64 key
EMPTY_KEY = np.uint64(0x0101010101010101)  # the key of "": eight 0x01 bytes, which no keyed value holds
_WORD_SEPARATOR = "\0" * SHORT  # values of 8 bytes joined by it sit in aligned uint64 words
_HIGH_BITS = np.uint64(0x8080808080808080)  # the top bit of every byte: clear in every ASCII byte
_MIX = np.uint64(0x9E3779B97F4A7C15)  # multiply-shift hashing's odd constants (2**64 / golden ratio)
_MIX2 = np.uint64(0xC2B2AE3D27D4EB4F)


class RawKeys(NamedTuple):
    """The keys of a (F, N) batch of strings: each value's bytes (up to 8) as a little-endian uint64.

    No value holds a NUL (else there are no keys), so a short value's zero padding is unambiguous. `slow`
    marks the values tables look up by dict (over 8 bytes, or not ASCII); None when there is none. A tuple:
    the native scan's keys are wrapped once per request, at a tuple's cost.
    """

    key: np.ndarray  # uint64 (F, N)
    slow: np.ndarray | None  # bool (F, N)

    @staticmethod
    def of(values: np.ndarray) -> RawKeys | None:
        """The keys of a (F, N) object array of str, or None when it must be looked up value by value."""
        return RawKeys.of_list(values.ravel().tolist(), values.shape)

    @staticmethod
    def of_list(values: list[str], shape: tuple[int, ...]) -> RawKeys | None:
        """The keys of F * N str given as a list (row-major in `shape`), or None: look them up one by one."""
        if _native_keys is not None:  # every value up to 8 ASCII characters: keyed in C, any length
            found = _native_keys(values)
            if found is not None:
                return RawKeys(np.frombuffer(found, np.uint64).reshape(shape), None)
        try:
            return RawKeys.of_joined(join(values), len(values), shape)
        except UnicodeEncodeError:  # a lone surrogate (the JSON and gRPC decoders reject them before here)
            return None

    @staticmethod
    def of_joined(text: str, m: int, shape: tuple[int, ...]) -> RawKeys | None:
        """The keys of `m` values given as `join(values)`, shaped `shape`; UnicodeEncodeError for a string
        UTF-8 cannot hold (a lone surrogate)."""
        data = text.encode("utf-8")  # first: a caller relies on it to find lone surrogates
        if b"\1" in data:
            return None  # a value holding 0x01 would read as "": by dict
        if np.count_nonzero(np.frombuffer(data, np.uint8)) != len(data) - SHORT * (m - 1):
            return None  # a NUL inside a value would cut it in two
        key = _word_keys(data, m)
        if key is None:
            return None  # values of other lengths: the dicts are as fast as cutting them out one by one
        slow = None if text.isascii() else ((key & _HIGH_BITS) != 0).reshape(shape)
        return RawKeys(key.reshape(shape), slow)

    def strings(self) -> list[str]:
        """The values the keys name, as a list (row-major in the keys' shape); only when every value is keyed
        (`slow` is None), as the key of an ASCII value of up to 8 bytes holds all of it."""
        if self.slow is not None:
            raise ValueError("some values are not keyed: their keys do not hold them")
        words = np.where(self.key == EMPTY_KEY, np.uint64(0), self.key).reshape(-1).astype("<u8")
        return words.view("S8").astype("U8").tolist()  # numpy drops an S8's trailing NULs: the padding

    def transposed(self) -> RawKeys:
        """The keys of the transposed batch (rows <-> fields), contiguous."""
        slow = None if self.slow is None else np.ascontiguousarray(self.slow.T)
        return RawKeys(np.ascontiguousarray(self.key.T), slow)

    @staticmethod
    def concat(parts: list[RawKeys]) -> RawKeys:
        """The keys of batches side by side (along N)."""
        slow = None
        if any(p.slow is not None for p in parts):
            slow = np.concatenate(
                [np.zeros(p.key.shape, bool) if p.slow is None else p.slow for p in parts], 1
            )
        return RawKeys(np.concatenate([p.key for p in parts], axis=1), slow)


def join(values: list[str]) -> str:
    """The values as `RawKeys.of_joined` reads them: one string, 8 NULs between two values (TypeError for a
    value that is not a str)."""
    return _WORD_SEPARATOR.join(values)


def _word_keys(data: bytes, m: int) -> np.ndarray | None:
    """The keys of `m` NUL-free values joined by 8 NULs when each has 0 or 8 bytes (Criteo's), else None.

    Then every value and separator is one aligned uint64 word or none: a separator is a zero word, and a
    value is the word between two separators, or nothing ("").
    """
    if len(data) % SHORT:
        return None
    words = np.frombuffer(data, "<u8")
    separators = np.flatnonzero(words == 0)
    # NUL runs are the separators (8 NULs each); all are aligned words only when every value's length is a
    # multiple of 8, and then at most one word between two of them means 0 or 8 bytes.
    if len(separators) != m - 1:
        return None
    bounds = np.empty(m + 1, np.intp)
    bounds[0], bounds[1:m], bounds[m] = -1, separators, len(words)
    present = bounds[1:] - bounds[:-1] - 1  # words per value
    if (present > 1).any():
        return None
    if not len(words):
        return np.full(m, EMPTY_KEY)
    return np.where(present == 1, words[np.maximum(bounds[1:] - 1, 0)], EMPTY_KEY)


def _field_salts(n: int) -> np.ndarray:
    """(n, 1) uint64: field f's salt sets the top bit of byte b where f + 1 has bit b.

    An ASCII key has those bits clear, so `key ^ salt` holds the key in the low bits and the field in the top
    ones: one uint64 names (field, value) exactly, and is never 0 (an empty slot).
    """
    if n >= 2**SHORT:
        raise ValueError(f"{n} fields: at most {2**SHORT - 1} fit the salts")
    return np.array(
        [sum(0x80 << (8 * b) for b in range(SHORT) if (f + 1) >> b & 1) for f in range(n)], np.uint64
    )[:, None]


class ValueTable:
    """Per field a dict value -> code, looked up a batch at a time; values no dict holds get `default`.

    A cuckoo hash table of salted keys: every entry sits in one of its two slots, so a lookup reads two
    slots, with no loop (linear probing, tried first, spent half its time on the probes after the first).
    """

    def __init__(self, tables: list[dict[str, int]], default: int) -> None:
        self.tables, self.default = tables, default
        self._salts = _field_salts(len(tables))
        salts = [int(s) for s in self._salts[:, 0]]
        entries = {
            (int.from_bytes(v.encode("ascii"), "little") if v else int(EMPTY_KEY)) ^ salts[f]: c
            for f, table in enumerate(tables)
            for v, c in table.items()
            if len(v) <= SHORT and v.isascii() and "\0" not in v and "\1" not in v
        }
        # Under half full, where two-choice cuckoo placement still succeeds: a small table stays in cache
        # (the features model runs right after a lookup and wants the cache too).
        bits = max(4, (2 * len(entries)).bit_length())
        while not self._place(entries, bits, default):
            bits += 1

    def _place(self, entries: dict[int, int], bits: int, default: int) -> bool:
        """Fill a table of 2**bits slots; False when an entry finds no place (then a larger one is tried).

        A displaced key's two slots are computed again (`_slots`' multiply-shift in Python integers), not
        looked up in a dict of every key's slots: that dict was a tuple per entry, made and dropped at every
        load, and its memory stayed scattered through the heap (docs/perf/serving-memory.md)."""
        self._shift = np.uint64(64 - bits)
        shift, mask, mix, mix2 = 64 - bits, (1 << 64) - 1, int(_MIX), int(_MIX2)
        keys, codes = [0] * 2**bits, [default] * 2**bits  # key 0: an empty slot
        firsts = self._slots(np.array(list(entries), np.uint64))[0].tolist()
        for slot, (key, code) in zip(firsts, entries.items(), strict=True):
            for _ in range(500):  # move the occupant to its other slot, and so on
                if not keys[slot]:
                    keys[slot], codes[slot] = key, code
                    break
                keys[slot], key = key, keys[slot]
                codes[slot], code = code, codes[slot]
                a, b = (key * mix & mask) >> shift, (key * mix2 & mask) >> shift
                slot = b if slot == a else a
            else:
                return False
        self._key, self._code = np.array(keys, np.uint64), np.array(codes, np.int32)
        return True

    def _slots(self, salted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A salted key's two slots: multiply-shift hashing with two odd constants."""
        return (
            ((salted * _MIX) >> self._shift).astype(np.intp),
            ((salted * _MIX2) >> self._shift).astype(np.intp),
        )

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
        """The table as arrays, for the native few-row transform (ctr_features/compiled/_table_native.c): the slots'
        salted keys (uint64, 0 = empty) and codes (int32), the fields' salts (uint64), the shift of the
        multiply-shift hashing and the default code."""
        return self._key, self._code, self._salts.ravel(), int(self._shift), self.default

    def lookup(self, values: np.ndarray, keys: RawKeys | None) -> np.ndarray:
        """(F, N) str values (and their keys) -> int32 (F, N) codes."""
        if keys is None:
            return self._by_dict(values)
        out = self.lookup_keys(keys)
        if keys.slow is not None:  # the values a key does not name: by dict
            rows, cols = np.nonzero(keys.slow)
            get = [t.get for t in self.tables]
            out[rows, cols] = [get[f](v, self.default) for f, v in zip(rows, values[rows, cols], strict=True)]
        return out

    def lookup_keys(self, keys: RawKeys) -> np.ndarray:
        """int32 (F, N) codes of the values `keys` name; those it does not (`keys.slow`) are not looked up.
        Keys row-major in memory (a merged batch's, RawBatch.concat) give codes row-major too (a view)."""
        key = keys.key
        if key.ndim == 2 and key.T.flags.c_contiguous and not key.flags.c_contiguous:
            return self._codes(key.T, self._salts.T).T
        return self._codes(key, self._salts)

    def _codes(self, key: np.ndarray, salts: np.ndarray) -> np.ndarray:
        """The codes of `key`, salted by `salts` (broadcast), in the keys' shape."""
        salted = (key ^ salts).reshape(-1)
        first, second = self._slots(salted)
        out = np.where(self._key[first] == salted, self._code[first], self.default)
        in_second = self._key[second] == salted
        out[in_second] = self._code[second[in_second]]
        return out.reshape(key.shape)

    def _by_dict(self, values: np.ndarray) -> np.ndarray:
        out = np.empty(values.shape, np.int32)
        for f, (table, row) in enumerate(zip(self.tables, values, strict=True)):
            out[f] = [table.get(v, self.default) for v in row.tolist()]
        return out
