"""pipelines/clicks."""
