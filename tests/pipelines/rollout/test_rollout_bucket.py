"""The rollout controller with its model's base_path in a bucket (real SeaweedFS, tests/object_store.py):
it lists the versions, reads manifests and checks objects in the bucket, and writes the s3:// path back."""

from __future__ import annotations

from pathlib import Path

from ctr_contract.repository import MANIFEST_PATH
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath
from pipelines.rollout.controller import Controller
from pipelines.rollout.journal import Store
from pipelines.rollout.policy import Policy
from serving.repository.model_config import parse_model_config
from tests.pipelines.rollout_env import write_config
from tests.serving.bucket_repo import publish, write_local_version

POLICY = Policy(min_rows=1000, auc_margin=0.01, confidence=0.95, calibration_bound=0.1)


def test_the_controller_decides_on_the_versions_in_a_bucket(s3_store, s3_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = ObjectStore()
    base = BucketPath(s3_store.make_bucket("rollout-from-a-bucket"), "prod/ctr")
    config = tmp_path / "models.config"
    write_config(config, base)  # type: ignore[arg-type]  # its str() is the base_path
    controller = Controller(config, "ctr", tmp_path / "live", Store(tmp_path / "rollout"), POLICY, None)

    def served() -> tuple[object, tuple[int, ...], dict[str, int]]:
        spec = {s.name: s for s in parse_model_config(config.read_text())}["ctr"]
        return spec.base_path, spec.policy.versions, spec.labels

    assert controller.tick() == []  # an empty prefix: nothing to decide
    publish(store, base, 1, tmp_path / "local")
    [first] = controller.tick()
    assert (first["action"], first["version"]) == ("promote", 1)
    assert served() == (base, (1,), {"stable": 1})
    publish(store, base, 2, tmp_path / "local", manifest=False)  # still being uploaded: waits
    assert controller.tick() == []
    broken = write_local_version(tmp_path / "broken", 3)  # a manifest whose model.onnx was never uploaded
    store.upload(base.bucket, base.key("3", MANIFEST_PATH), broken / MANIFEST_PATH)
    [rollback] = controller.tick()
    assert (rollback["action"], rollback["version"]) == ("rollback", 3)
    assert "1 object(s) its manifest lists are missing, first 'model.onnx'" in rollback["reason"]
    assert served() == (base, (1,), {"stable": 1})
    publish(store, base, 4, tmp_path / "local")
    load, shadow = controller.tick()
    assert [(d["action"], d["version"]) for d in (load, shadow)] == [("load", 4), ("shadow", 4)]
    assert served() == (base, (1, 4), {"stable": 1, "shadow": 4})
