"""What a decoded request hands to a servable: the signature it calls and its batch of rows.

`serving_default` takes float32 features (N, width); `raw` takes a RawBatch of the Criteo fields. Every codec
(serving/codecs/) ends in a DecodedRequest, and a servable runs it with the runner of its signature
(serving/runtime/servable.py), so nothing past the codecs asks which kind of batch it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import Any, cast

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.value_table import RawKeys
from serving.signatures import RAW_SIGNATURE


@dataclass(frozen=True)
class RawBatch:
    """A decoded raw request, field-major so each field's values are one contiguous row.

    numeric: float64 (13, N), NaN = missing; categorical: object str (26, N), "" = missing.
    """

    numeric: np.ndarray
    categorical: np.ndarray

    def __len__(self) -> int:
        return self.numeric.shape[1]

    @cached_property
    def keys(self) -> RawKeys | None:
        """The categorical values' keys, computed once and shared by the transform and drift binning."""
        if "_strings" in self.__dict__:  # as decoded: from the list, not the object array
            return RawKeys.of_list(self.__dict__["_strings"], (len(CATEGORICAL_FIELDS), len(self)))
        return RawKeys.of(self.categorical)

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """The `raw` signature's 39 inputs, each (N,) (views, no copy)."""
        return {
            **dict(zip(NUMERIC_FIELDS, self.numeric, strict=True)),
            **dict(zip(CATEGORICAL_FIELDS, self.categorical, strict=True)),
        }

    @staticmethod
    def from_rows(numeric: np.ndarray, categorical: np.ndarray, keys: RawKeys | None = None) -> RawBatch:
        """Row-major (N, 13) and (N, 26) -> a field-major RawBatch; `keys`: its (26, N) keys when the decoder
        has them already."""
        batch = RawBatch(np.ascontiguousarray(numeric.T), np.ascontiguousarray(categorical.T))
        if keys is not None:
            batch.__dict__["keys"] = keys  # what the `keys` property would compute
        return batch

    @staticmethod
    def of_strings(
        numeric: np.ndarray, strings: list[str], keys: RawKeys | None = None, keys_made: bool = False
    ) -> RawBatch:
        """(13, N) counts and the 26 * N categorical values field-major as a list, as a decoder has them: the
        object array `categorical` is only made if something reads it (the transform and drift read the
        list, or the keys, instead). `keys_made`: `keys` are the values' keys as the decoder found them
        (None: look them up by dict), not to be computed again."""
        batch = object.__new__(_StringsBatch)
        object.__setattr__(batch, "numeric", numeric)
        batch.__dict__["_strings"] = strings
        if keys_made or keys is not None:
            batch.__dict__["keys"] = keys  # what the `keys` property would compute
        return batch

    @staticmethod
    def of_keys(numeric: np.ndarray, keys: RawKeys) -> RawBatch:
        """(13, N) counts and the (26, N) keys of the categorical values, every value keyed (`keys.slow` is
        None), as the native decoder has them (serving/codecs/raw_body.py): the values themselves are only
        made, from the keys, if something reads them."""
        if keys.slow is not None:
            raise ValueError("of_keys needs every value keyed (keys.slow is None)")
        batch = object.__new__(_KeyedBatch)
        object.__setattr__(batch, "numeric", numeric)
        batch.__dict__["keys"] = keys
        return batch

    def strings(self) -> list[str]:
        """The categorical values field-major (26 * N), as a list."""
        found = self.__dict__.get("_strings")
        return found if found is not None else self.categorical.ravel().tolist()

    @staticmethod
    def concat(parts: list[RawBatch]) -> RawBatch:
        """The batches one after another (what the dynamic batcher runs as one call): two copies (three when
        every part's keys are known: they are joined too, not computed again). The merged batch remembers
        its parts, which get their share of its entries (`remember_entries`)."""
        numeric = np.concatenate([p.numeric for p in parts], axis=1)
        known = [p.__dict__.get("keys") for p in parts]
        keys = RawKeys.concat(cast(list[RawKeys], known)) if all(k is not None for k in known) else None
        if keys is not None and keys.slow is None:  # every value keyed: the values are made only if read
            merged = RawBatch.of_keys(numeric, keys)
        elif all("_strings" in p.__dict__ for p in parts):  # as decoded: the lists joined field by field
            lists = [(p.strings(), len(p)) for p in parts]
            if all(n == 1 for _, n in lists):  # single rows (the batcher's usual parts): a transpose
                strings = list(chain.from_iterable(zip(*(s for s, _ in lists), strict=True)))
            else:
                strings = list(
                    chain.from_iterable(
                        s[f * n : (f + 1) * n] for f in range(len(CATEGORICAL_FIELDS)) for s, n in lists
                    )
                )
            merged = RawBatch.of_strings(numeric, strings, keys)
        else:
            merged = RawBatch(numeric, np.concatenate([p.categorical for p in parts], axis=1))
            if keys is not None:
                merged.__dict__["keys"] = keys
        merged.__dict__["parts"] = parts
        return merged

    def remember_entries(self, owner: object, entries: np.ndarray | list[int]) -> None:
        """Keep the transform's entries of this batch: (26, N) ints, or one row's 26 as a list. `owner`: the
        RawTransform whose entries they are. Drift bins the categoricals from them instead of looking every
        value up again (serving/observability/drift.py). A merged batch hands each part its columns."""
        self.__dict__["_entries"] = (owner, entries)
        start = 0
        for part in self.__dict__.get("parts", ()):
            end = start + len(part)
            part.__dict__["_entries"] = (owner, cast(np.ndarray, entries)[:, start:end])
            start = end

    def entries(self) -> tuple[object, np.ndarray | list[int]] | None:
        """(owner, entries) of `remember_entries`, or None: no transform looked this batch up."""
        return self.__dict__.get("_entries")


class _StringsBatch(RawBatch):
    """A RawBatch made by `RawBatch.of_strings`: its object array is made from the list when first read."""

    @cached_property
    def categorical(self) -> np.ndarray:  # type: ignore[override]
        strings = self.strings()
        return np.fromiter(strings, object, len(strings)).reshape(len(CATEGORICAL_FIELDS), len(self))


class _KeyedBatch(_StringsBatch):
    """A RawBatch made by `RawBatch.of_keys`: its values are made from the keys when first read."""

    def strings(self) -> list[str]:
        found = self.__dict__.get("_strings")
        if found is None:
            found = self.__dict__["_strings"] = self.keys.strings()  # type: ignore[union-attr]
        return found


Batch = np.ndarray | RawBatch  # float32 (N, width) for `serving_default`, RawBatch for `raw`


@dataclass(frozen=True)
class DecodedRequest:
    """One predict request after its codec: the signature key it calls and its rows."""

    signature: str  # DEFAULT_SIGNATURE or RAW_SIGNATURE
    batch: Batch

    def logged_inputs(self) -> dict[str, Any]:
        """The batch for the request log: `instances` (features) or columnar `inputs` (raw fields)."""
        if self.signature == RAW_SIGNATURE:
            raw = cast(RawBatch, self.batch)
            return {"inputs": {k: v.tolist() for k, v in raw.inputs.items()}}
        return {"instances": self.batch}
