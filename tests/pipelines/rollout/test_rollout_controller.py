"""The rollout controller on a real model repository, a real config file and hand-written evaluator snapshots.

No server here (probe None: a listed version counts as loaded); tests/pipelines/rollout/test_rollout_controller_server.py
runs one. Each test drives `Controller.tick()` and reads back what a server would: the config file through
serving's own parser, and the journal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctr_contract.traffic import parse_traffic
from pipelines.rollout.config_file import Target, render
from pipelines.rollout.controller import Controller
from pipelines.rollout.journal import Store
from pipelines.rollout.policy import Policy, PolicyError, judge, load_policy
from serving.repository.model_config import parse_model_config
from tests.pipelines.rollout_env import add_version, corrupt, decisions, fig, write_config, write_snapshot

POLICY = Policy(min_rows=1000, auc_margin=0.01, confidence=0.95, calibration_bound=0.1)


class Env:
    def __init__(self, root: Path) -> None:
        self.base, self.config = root / "models" / "ctr", root / "models.config"
        self.eval_state, self.state_dir = root / "live", root / "rollout"
        self.base.mkdir(parents=True)
        write_config(self.config, self.base)

    def controller(self, policy: Policy = POLICY) -> Controller:
        return Controller(self.config, "ctr", self.eval_state, Store(self.state_dir), policy, None)

    def served(self) -> tuple[tuple[int, ...], dict[str, int], dict[str, float]]:
        """(listed versions, labels, shares) of model ctr as the server parses the file."""
        text = self.config.read_text()
        spec = {s.name: s for s in parse_model_config(text)}["ctr"]
        split = parse_traffic(text)["ctr"]  # the server's own reading of the traffic line
        return (
            spec.policy.versions,
            spec.labels,
            {"canary_percent": split.canary_percent, "shadow_percent": split.shadow_percent},
        )


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def _actions(c: Controller) -> list[tuple[str, int]]:
    return [(d["action"], d["version"]) for d in c.decisions]


def test_the_first_version_becomes_stable_directly(env: Env) -> None:
    c = env.controller()
    assert c.tick() == []  # no version yet: nothing to decide
    add_version(env.base, 1)
    [d] = c.tick()
    assert (d["action"], d["version"], d["seq"]) == ("promote", 1, 1)
    assert env.served() == ((1,), {"stable": 1}, {"canary_percent": 0.0, "shadow_percent": 0.0})
    assert c.tick() == []  # nothing more is due
    # the other model's entry, its traffic line and the comment are kept
    text = env.config.read_text()
    assert "# our models" in text and "# ctr-traffic: model=other canary_percent=5" in text
    other = {s.name: s for s in parse_model_config(text)}["other"]
    assert (str(other.base_path), other.policy.kind, other.labels) == ("/models/other", "latest", {})


def test_a_good_version_moves_through_shadow_and_canary_to_stable(env: Env) -> None:
    add_version(env.base, 1)
    c = env.controller()
    c.tick()
    add_version(env.base, 2)
    [load, shadow] = c.tick()  # listed, then (no server to wait for) labelled shadow
    assert (load["action"], shadow["action"]) == ("load", "shadow")
    assert env.served() == (
        (1, 2),
        {"stable": 1, "shadow": 2},
        {"canary_percent": 0.0, "shadow_percent": 10.0},
    )
    assert c.metrics.candidate_version.labels("ctr")._value.get() == 2

    write_snapshot(env.eval_state, 1, fig(1, "stable", 0.75), fig(2, "shadow", 0.76, rows=400))
    assert c.tick() == []  # 400 < 1000 rows: wait
    write_snapshot(env.eval_state, 2, fig(1, "stable", 0.75), fig(2, "shadow", 0.76))
    [canary] = c.tick()
    assert canary["action"] == "canary" and canary["figures"]["test"]["lower"] > -0.01
    assert canary["figures"]["snapshot_interval"] == 2
    assert env.served() == (
        (1, 2),
        {"stable": 1, "canary": 2},
        {"canary_percent": 10.0, "shadow_percent": 0.0},
    )
    assert c.metrics.canary_percent.labels("ctr")._value.get() == 10.0

    # shadow figures do not count for the canary step: it needs its own rows
    assert c.tick() == []
    write_snapshot(env.eval_state, 3, fig(1, "stable", 0.75), fig(2, "shadow", 0.76), fig(2, "canary", 0.755))
    [promote] = c.tick()
    assert (promote["action"], promote["version"], promote["to"]) == ("promote", 2, "stable")
    assert env.served() == ((1, 2), {"stable": 2}, {"canary_percent": 0.0, "shadow_percent": 0.0})
    assert (c.state.stable, c.state.previous, c.state.candidate) == (2, 1, None)
    assert [d["seq"] for d in decisions(env.state_dir)] == [1, 2, 3, 4, 5]
    assert json.loads((env.state_dir / "state.json").read_text())["seq"] == 5
    counted = {a: c.metrics.decisions.labels("ctr", a)._value.get() for a in ("promote", "load", "rollback")}
    assert counted == {"promote": 2, "load": 1, "rollback": 0}


def test_a_worse_canary_is_rolled_back_and_never_retried(env: Env) -> None:
    add_version(env.base, 1)
    c = env.controller(Policy(steps=("canary", "stable"), min_rows=1000))
    c.tick()
    add_version(env.base, 2)
    assert [d["action"] for d in c.tick()] == ["load", "canary"]
    write_snapshot(env.eval_state, 1, fig(1, "stable", 0.75), fig(2, "canary", 0.745))
    assert c.tick() == []  # 0.005 below, interval [-0.0124, +0.0024]: neither proved worse nor not worse
    write_snapshot(env.eval_state, 2, fig(1, "stable", 0.75, var=1e-5), fig(2, "canary", 0.70, var=1e-5))
    [rollback] = c.tick()
    assert rollback["action"] == "rollback" and rollback["figures"]["test"]["upper"] < -0.01
    assert "worse than stable" in rollback["reason"]
    assert env.served() == ((1,), {"stable": 1}, {"canary_percent": 0.0, "shadow_percent": 0.0})
    assert c.state.rejected == [2] and c.tick() == []  # never a candidate again
    add_version(env.base, 3)
    assert [(d["action"], d["version"]) for d in c.tick()] == [("load", 3), ("canary", 3)]


def test_a_miscalibrated_candidate_is_rolled_back_whatever_its_auc(env: Env) -> None:
    add_version(env.base, 1)
    c = env.controller()
    c.tick()
    add_version(env.base, 2)
    c.tick()
    write_snapshot(env.eval_state, 1, fig(2, "shadow", 0.80, ratio=1.25))  # no stable figures needed
    [rollback] = c.tick()
    assert (
        rollback["action"] == "rollback"
        and "calibration ratio 1.2500 outside [0.9, 1.1]" in rollback["reason"]
    )
    assert env.served()[1] == {"stable": 1}


def test_corrupt_files_are_rolled_back_without_being_listed(env: Env) -> None:
    add_version(env.base, 1)
    c = env.controller()
    c.tick()
    corrupt(add_version(env.base, 2))
    [rollback] = c.tick()
    assert (rollback["action"], rollback["version"], rollback["from"]) == ("rollback", 2, None)
    assert "sha256" in rollback["reason"]
    assert env.served()[0] == (1,)


def test_versions_between_stable_and_the_newest_are_skipped(env: Env) -> None:
    add_version(env.base, 1)
    c = env.controller()
    c.tick()
    for v in (2, 3, 4):
        add_version(env.base, v)
    load = c.tick()[0]
    assert (load["action"], load["version"]) == ("load", 4) and "skips [2, 3]" in load["reason"]
    write_snapshot(env.eval_state, 1, fig(4, "shadow", 0.6, ratio=2.0))
    c.tick()  # 4 rolled back: 2 and 3 are not candidates later
    assert c.tick() == [] and c.state.candidate is None


def test_an_existing_stable_label_is_adopted(env: Env) -> None:
    add_version(env.base, 1)
    add_version(env.base, 2)
    write_config(env.config, env.base, 'version_labels { key: "stable" value: 1 } ')
    c = env.controller()
    assert _actions(c) == []
    c.tick()
    assert _actions(c)[:2] == [("adopt", 1), ("load", 2)]


def test_the_written_config_is_what_the_servers_parsers_read(env: Env) -> None:
    add_version(env.base, 1)
    add_version(env.base, 2)
    text = env.config.read_text()
    target = Target((1, 2), {"stable": 1, "canary": 2}, canary_percent=12.5)
    written = render(text, "ctr", target)
    assert render(written, "ctr", target) == written  # rewriting the same target changes nothing
    spec = {s.name: s for s in parse_model_config(written)}["ctr"]
    assert (spec.policy.kind, spec.policy.versions, spec.labels) == (
        "specific",
        (1, 2),
        {"stable": 1, "canary": 2},
    )
    assert "# ctr-traffic: model=ctr canary_percent=12.5 shadow_percent=0" in written
    parsed = parse_traffic(written)
    assert parsed["ctr"].canary_percent == 12.5 and parsed["other"].canary_percent == 5


def test_policy_errors_name_the_key() -> None:
    with pytest.raises(PolicyError, match="canary_percent 120"):
        load_policy(None, {"canary_percent": 120})
    with pytest.raises(PolicyError, match="subsequence"):
        load_policy(None, {"steps": ["canary", "shadow", "stable"]})
    with pytest.raises(PolicyError, match="unknown policy keys"):
        load_policy(None, {"canary": 1})
    assert load_policy(None, {"steps": ["stable"]}).steps == ("stable",)
    two = Policy(steps=("canary", "stable"))
    assert (two.next_step("load"), two.next_step("shadow"), two.next_step("canary")) == (
        "canary",
        "canary",
        "stable",
    )


def test_the_test_is_one_sided_at_the_given_confidence() -> None:
    p = Policy(min_rows=100, auc_margin=0.0, confidence=0.95)
    # d = -0.01, se = 0.00612 (var 1.875e-5 each): lower -0.0201, upper +0.0001 -> wait; at 0.9: upper -0.0022
    stable, cand = fig(1, "stable", 0.75, var=1.875e-5), fig(2, "canary", 0.74, var=1.875e-5)
    assert judge(cand, stable, p).action == "wait"
    assert judge(cand, stable, Policy(min_rows=100, auc_margin=0.0, confidence=0.9)).action == "rollback"
    assert judge(cand, stable, Policy(min_rows=100, auc_margin=0.025, confidence=0.95)).action == "promote"
    assert judge(None, stable, p).action == "wait"


def test_a_broken_config_edit_stops_decisions_until_fixed(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    add_version(env.base, 1)
    good = env.config.read_text()
    env.config.write_text("model_config_list { config { name: 'ctr' ")  # a person's unfinished edit
    c = env.controller()
    assert c.tick() == [] and c.tick() == []
    errors = [r.getMessage() for r in caplog.records if "no decision until" in r.getMessage()]
    assert len(errors) == 1 and "not ModelServerConfig text" in errors[0]  # one line, not one per tick
    env.config.write_text(good)
    assert _actions(c) == [] and [d["action"] for d in c.tick()] == ["promote"]


def test_a_restarted_controller_counts_the_journal_not_again(env: Env) -> None:
    add_version(env.base, 1)
    c = env.controller()
    c.tick()
    add_version(env.base, 2)
    c.tick()
    again = env.controller()
    counts = {a: again.metrics.decisions.labels("ctr", a)._value.get() for a in ("promote", "load", "shadow")}
    assert counts == {"promote": 1, "load": 1, "shadow": 1}
    assert again.metrics.stable_version.labels("ctr")._value.get() == 1
    assert again.metrics.shadow_percent.labels("ctr")._value.get() == 10
    assert again.tick() == [] and again.state.seq == 3


def test_a_ratio_off_by_chance_on_few_clicks_waits_instead_of_rolling_back() -> None:
    p = Policy(min_rows=100, calibration_bound=0.1, calibration_z=3.0)
    stable = fig(1, "stable", 0.75)
    few = {
        **fig(2, "canary", 0.76, rows=190),
        "positives": 57,
        "predicted": 50.5,
        "calibration_ratio": 50.5 / 57,
    }
    verdict = judge(few, stable, p)  # 0.886 outside [0.9, 1.1], but z = +1.07: chance
    assert verdict.action == "wait" and "by chance so far" in verdict.reason
    assert verdict.figures["calibration"]["z"] == pytest.approx(1.07, abs=0.01)
    off = {**few, "predicted": 57 * 1.25, "calibration_ratio": 1.25}  # z = -2.14 on 57 clicks: chance at 3
    assert judge(off, stable, p).action == "wait"
    worse = {**few, "predicted": 57 * 1.4, "calibration_ratio": 1.4}  # z = -3.35: caught on 57 clicks
    assert judge(worse, stable, p).action == "rollback"
    many = {**fig(2, "canary", 0.76, rows=2000, ratio=1.4)}  # 280 predicted for 200 clicks: z = -5.1
    assert judge(many, stable, p).action == "rollback"


def test_a_state_folder_of_another_model_is_refused_with_the_flag_to_change(env: Env) -> None:
    env.controller()  # saves model ctr's fresh state
    with pytest.raises(ValueError) as e:
        Controller(env.config, "other", env.eval_state, Store(env.state_dir), POLICY, None)
    assert str(e.value) == (
        f"{env.state_dir} was rolled out with --model 'ctr', not 'other'; use that or a new --state-dir"
    )
