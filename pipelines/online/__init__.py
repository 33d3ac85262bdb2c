"""Online learning: the trainer that keeps a served model fresh (the traffic simulator is in pipelines.demos)."""
