"""The demos and the traffic simulator: they drive the product from outside, and no product module imports them.

`python -m pipelines.demos.online` (`make online-demo`), `python -m pipelines.demos.rollout` (`make
rollout-demo`) and `python -m pipelines.demos.simulate`, the drifting world's traffic and clicks against a
running server (docs/online-learning.md, docs/rollout.md). tests/test_boundaries.py holds the rule.
"""
