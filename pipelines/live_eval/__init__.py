"""Live evaluation: each served version judged on its own clicks (docs/live-eval.md)."""
