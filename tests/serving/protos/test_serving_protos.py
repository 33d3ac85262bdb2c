"""The committed descriptor set is exactly tensorflow-serving-api's; the warm-up reader matches TF's writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import descriptor_pb2

from serving import protos
from serving.errors import ModelLoadError
from serving.protos.refresh import build_descriptor_set
from serving.repository.warmup import read_tfrecords, warmup_batches
from tests.serving.model_repo import write_warmup


def test_committed_descriptor_set_equals_tensorflow_serving_api() -> None:
    shipped = {f.name: f.SerializeToString(deterministic=True) for f in build_descriptor_set().file}
    fds = descriptor_pb2.FileDescriptorSet.FromString(protos.DESCRIPTOR_SET.read_bytes())
    committed = {f.name: f.SerializeToString(deterministic=True) for f in fds.file}
    assert committed == shipped, (
        "run `python -m serving.protos.refresh` after upgrading tensorflow-serving-api"
    )


def test_private_pool_messages_are_wire_compatible_with_stock_ones() -> None:
    from tensorflow_serving.apis import predict_pb2

    stock = predict_pb2.PredictRequest()
    stock.model_spec.name = "ctr"
    stock.model_spec.version.value = 4
    ours = protos.PredictRequest.FromString(stock.SerializeToString())
    assert (ours.model_spec.name, ours.model_spec.version.value) == ("ctr", 4)
    assert type(ours).DESCRIPTOR.file.pool is not type(stock).DESCRIPTOR.file.pool


def test_warmup_reader_decodes_records_written_by_tensorflow(tmp_path: Path) -> None:
    batches = [np.full((n, 128), n, np.float32) for n in (1, 3)]
    write_warmup(tmp_path / "assets.extra" / "tf_serving_warmup_requests", batches)
    decoded = warmup_batches(tmp_path, "features")
    assert [b.shape for b in decoded] == [(1, 128), (3, 128)]
    np.testing.assert_array_equal(decoded[1], batches[1])


def test_warmup_reader_rejects_a_corrupt_checksum(tmp_path: Path) -> None:
    path = tmp_path / "assets.extra" / "tf_serving_warmup_requests"
    write_warmup(path, [np.zeros((1, 128), np.float32)])
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # flip one payload byte
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="corrupt data checksum in record at byte 0"):
        list(read_tfrecords(path))
