"""The bench's machinery: run sizes, bounded child processes, the pipeline inputs, foreign venvs, servers under load."""
