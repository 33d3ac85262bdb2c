"""RawBatch: the raw Criteo rows of one request (or of the batcher's merged requests), field-major.

What every raw decoder makes (the REST scan and exact path in serving/codecs/, gRPC and v2 tensors) and what
the compiled FeatureSpec (ctr_features/compiled/table.py) and drift binning read. A decoder hands the rows in
the form it has them: object arrays, a field-major list of str, or only the values' 8-byte keys (the native
scan's, ctr_features/compiled/value_table.py's `RawKeys`); every other form is made from it once, when first
read, and kept. The row count is kept too (`len` is read several times a request by the batcher).

Not frozen: besides those forms made on demand, the transform leaves its entries on the batch for drift
(`remember_entries`). The rows a batch holds never change: only what is derived from them is added.
"""

from __future__ import annotations

from itertools import chain
from typing import cast

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.value_table import RawKeys
from ctr_features.layout import N_CAT

_new = object.__new__  # a batch made field by field (`_of`, `of_scan`), without __init__'s defaults


class RawBatch:
    """A decoded raw request: numeric float64 (13, N), NaN = missing; categorical object str (26, N), "" =
    missing. `RawBatch(numeric, categorical)` from arrays; `of_strings` and `of_keys` from a decoder's forms."""

    __slots__ = (
        "_categorical",
        "_entries",
        "_key",
        "_keyed",
        "_keys",
        "_n",
        "_strings",
        "numeric",
    )

    def __init__(self, numeric: np.ndarray, categorical: np.ndarray) -> None:
        self.numeric = numeric
        self._n: int = numeric.shape[1]
        self._categorical: np.ndarray | None = categorical
        self._strings: list[str] | None = None  # the values field-major as a list, when held
        self._keys: RawKeys | None = None  # made from `_key` when first read, if only that is held
        self._key: np.ndarray | None = None  # the keys' array when every value is keyed (`_keys.slow` None)
        self._keyed = False  # whether the keys are known (None then: the values are looked up by dict)
        self._entries: tuple[object, np.ndarray | list[int]] | None = None

    def __len__(self) -> int:
        return self._n

    @staticmethod
    def _of(numeric: np.ndarray, strings: list[str] | None, keys: RawKeys | None, keyed: bool) -> RawBatch:
        """A batch without its object array (made from the list or the keys when first read)."""
        batch = RawBatch.of_scan(numeric, cast(np.ndarray, None))
        batch._strings, batch._keys, batch._keyed = strings, keys, keyed
        batch._key = None if keys is None or keys.slow is not None else keys.key
        return batch

    @staticmethod
    def of_scan(numeric: np.ndarray, key: np.ndarray) -> RawBatch:
        """(13, N) counts and the (26, N) uint64 keys of the categorical values, every value keyed, as the
        native scan makes them (serving/codecs/rest_codec.py): `of_keys` at the fewest Python objects a
        request (its RawKeys is made only if read; a merged batch joins the parts' arrays)."""
        batch = _new(RawBatch)
        batch.numeric, batch._n, batch._key, batch._keyed = numeric, numeric.shape[1], key, True
        batch._categorical = batch._strings = batch._keys = batch._entries = None
        return batch

    @staticmethod
    def from_rows(numeric: np.ndarray, categorical: np.ndarray, keys: RawKeys | None = None) -> RawBatch:
        """Row-major (N, 13) and (N, 26) -> a field-major RawBatch; `keys`: its (26, N) keys when the decoder
        has them already."""
        batch = RawBatch(np.ascontiguousarray(numeric.T), np.ascontiguousarray(categorical.T))
        if keys is not None:
            batch._set_keys(keys)
        return batch

    @staticmethod
    def of_strings(
        numeric: np.ndarray, strings: list[str], keys: RawKeys | None = None, keys_made: bool = False
    ) -> RawBatch:
        """(13, N) counts and the 26 * N categorical values field-major as a list, as a decoder has them: the
        object array `categorical` is only made if something reads it (the transform and drift read the
        list, or the keys, instead). `keys_made`: `keys` are the values' keys as the decoder found them
        (None: look them up by dict), not to be computed again."""
        return RawBatch._of(numeric, strings, keys, keys_made or keys is not None)

    @staticmethod
    def of_keys(numeric: np.ndarray, keys: RawKeys) -> RawBatch:
        """(13, N) counts and the (26, N) keys of the categorical values, every value keyed (`keys.slow` is
        None), as the native scan has them (serving/codecs/raw_body.py): the values themselves are only made,
        from the keys, if something reads them."""
        if keys.slow is not None:
            raise ValueError("of_keys needs every value keyed (keys.slow is None)")
        return RawBatch._of(numeric, None, keys, True)

    @property
    def categorical(self) -> np.ndarray:
        """The values as an object array (26, N), made from the list (or the keys) when first read."""
        if self._categorical is None:
            strings = self.strings()
            self._categorical = np.fromiter(strings, object, len(strings)).reshape(N_CAT, self._n)
        return self._categorical

    def strings(self) -> list[str]:
        """The categorical values field-major (26 * N), as a list."""
        if self._strings is not None:
            return self._strings
        if self._categorical is not None:  # made from the arrays each time: the batch holds the arrays
            return cast(list[str], self._categorical.ravel().tolist())
        self._strings = cast(RawKeys, self.known_keys()).strings()  # keys alone: every value keyed
        return self._strings

    @property
    def keys(self) -> RawKeys | None:
        """The categorical values' keys, computed once and shared by the transform and drift binning; None:
        the values are looked up by dict."""
        if not self._keyed:
            if self._strings is not None:  # as decoded: from the list, not the object array
                self._set_keys(RawKeys.of_list(self._strings, (N_CAT, self._n)))
            else:
                self._set_keys(RawKeys.of(self.categorical))
        return self.known_keys()

    def known_keys(self) -> RawKeys | None:
        """The keys if already known (from the decoder, or computed), without computing them."""
        if self._keys is None and self._key is not None:  # the scan's array alone: wrapped once, when read
            self._keys = RawKeys(self._key, None)
        return self._keys

    def _set_keys(self, keys: RawKeys | None) -> None:
        self._keys, self._keyed = keys, True
        self._key = None if keys is None or keys.slow is not None else keys.key

    @property
    def keys_known(self) -> bool:
        """Whether the keys are known (`keys` does not compute them)."""
        return self._keyed

    @property
    def holds_strings(self) -> bool:
        """Whether the batch holds its values as a list (a decoder's, or made from the keys)."""
        return self._strings is not None

    @property
    def holds_array(self) -> bool:
        """Whether the batch holds its values as an object array (given, or made when read)."""
        return self._categorical is not None

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """The `raw` signature's 39 inputs, each (N,) (views, no copy)."""
        return {
            **dict(zip(NUMERIC_FIELDS, self.numeric, strict=True)),
            **dict(zip(CATEGORICAL_FIELDS, self.categorical, strict=True)),
        }

    @staticmethod
    def concat(parts: list[RawBatch]) -> RawBatch:
        """The batches one after another (what the dynamic batcher runs as one call): two copies (three when
        every part's keys are known: they are joined too, not computed again)."""
        numeric = np.concatenate([p.numeric for p in parts], axis=1)
        single = all(p._n == 1 for p in parts)
        arrays = [p._key for p in parts]
        if all(k is not None for k in arrays):  # every value keyed (the scan's parts): their arrays joined
            key = _row_major(cast(list[np.ndarray], arrays), numeric.shape[1], single)
            merged = RawBatch.of_scan(numeric, key)
        else:
            merged = RawBatch._joined_values(parts, numeric)
        return merged

    @staticmethod
    def _joined_values(parts: list[RawBatch], numeric: np.ndarray) -> RawBatch:
        """`concat` of parts some of whose values are not keyed (else `_row_major`): their lists or arrays, and
        their keys when every part's are known (joined, not computed again)."""
        known = [p.known_keys() if p._keyed else None for p in parts]
        keys = RawKeys.concat(cast(list[RawKeys], known)) if all(k is not None for k in known) else None
        if all(p._strings is not None for p in parts):  # as decoded: the lists joined field by field
            lists = [(p.strings(), len(p)) for p in parts]
            if all(n == 1 for _, n in lists):  # single rows (the batcher's usual parts): a transpose
                strings = list(chain.from_iterable(zip(*(s for s, _ in lists), strict=True)))
            else:
                strings = list(
                    chain.from_iterable(s[f * n : (f + 1) * n] for f in range(N_CAT) for s, n in lists)
                )
            merged = RawBatch.of_strings(numeric, strings, keys)
        else:
            merged = RawBatch(numeric, np.concatenate([p.categorical for p in parts], axis=1))
            if keys is not None:
                merged._set_keys(keys)
        return merged

    def remember_entries(self, owner: object, entries: np.ndarray | list[int]) -> None:
        """Keep the transform's entries of this batch: (26, N) ints, or one row's 26 as a list. `owner`: the
        RawTransform whose entries they are. Drift bins the categoricals from them instead of looking every
        value up again (serving/observability/drift.py, told of the batch the model ran: a merged batch's
        parts need none of their own)."""
        self._entries = (owner, entries)

    def entries(self) -> tuple[object, np.ndarray | list[int]] | None:
        """(owner, entries) of `remember_entries`, or None: no transform looked this batch up."""
        return self._entries


def _row_major(keys: list[np.ndarray], n: int, single: bool) -> np.ndarray:
    """(F, n_i) uint64 key arrays joined along N into an (F, n) view of a row-major (n, F) array: the entries
    looked up from it are row-major too (ValueTable.lookup_keys), so each single-row part's share is contiguous
    (drift joins their bytes when it keeps single rows apart). `single`: every part holds one row, whose (F, 1) keys are one
    row's bytes: they are joined as bytes (read-only then), ~3x faster than np.concatenate of many small arrays."""
    if single:
        try:
            return np.frombuffer(b"".join(keys), np.uint64).reshape(n, -1).T  # type: ignore[arg-type]
        except (TypeError, BufferError):  # a part's keys are a strided view: not one block of bytes
            pass
    out = np.empty((n, keys[0].shape[0]), np.uint64).T
    np.concatenate(keys, axis=1, out=out)
    return out
