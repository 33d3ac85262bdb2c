"""What a decoded request hands to a servable: the signature it calls and its batch of rows.

`serving_default` takes float32 features (N, width); `raw` takes a RawBatch of the Criteo fields
(ctr_features/compiled/raw_batch.py). Every codec
(serving/codecs/) ends in a DecodedRequest, and a servable runs it with the runner of its signature
(serving/runtime/servable.py), so nothing past the codecs asks which kind of batch it holds.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from serving.signatures import RAW_SIGNATURE

Batch = np.ndarray | RawBatch  # float32 (N, width) for `serving_default`, RawBatch for `raw`


class DecodedRequest(NamedTuple):
    """One predict request after its codec: the signature key it calls and its rows.

    A tuple: made once per request by every codec, so it costs a tuple, not a frozen dataclass's `__init__`.
    """

    signature: str  # DEFAULT_SIGNATURE or RAW_SIGNATURE
    batch: Batch

    def logged_inputs(self) -> dict[str, Any]:
        """The batch for the request log: `instances` (features) or columnar `inputs` (raw fields)."""
        if self.signature == RAW_SIGNATURE:
            # Columns as RawBatch.inputs has them, made from the counts' one list and the values' field-major
            # list (the object array RawBatch.categorical is not made for a log line).
            raw = cast(RawBatch, self.batch)
            n, values = len(raw), raw.strings()
            columns: dict[str, list[Any]] = dict(zip(NUMERIC_FIELDS, raw.numeric.tolist(), strict=True))
            for i, name in enumerate(CATEGORICAL_FIELDS):
                columns[name] = values[i * n : (i + 1) * n]
            return {"inputs": columns}
        return {"instances": self.batch}
