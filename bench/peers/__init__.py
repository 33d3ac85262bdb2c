"""The peers we measure against: JAX, MLX, KServe, TorchServe, a naive FastAPI server, uvicorn and granian.

Some run inside their own venvs (`bench.harness.foreign_venvs`), by module or by path: import nothing heavy here.
"""
