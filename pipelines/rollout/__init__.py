"""The rollout controller (`python -m pipelines.rollout`): each new version through shadow, canary, stable (docs/rollout.md)."""
