"""The JAX + Flax row of the training section: the same MLP, Adam, batches and epochs, run in `.venv-jax`.

    .venv-jax/bin/python -m bench.peers.jax_train --features features.npz --epochs 2 --repeats 3 --out jax.json

One `jax.jit` train step (forward, BCE-with-logits, grad, optax Adam update); dropout as in `CTRNet` (0.3, 0.2)
from a per-step PRNG key. Weights start as torch's `nn.Linear` does (uniform ±1/sqrt(fan_in)), so AUCs compare.
Samples/s counts the epochs after the first (which pays for the compilation). Only numpy, jax, flax and optax
are imported here (plus `ctr_model.metrics`, plain numpy): this venv has no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench.peers.train_worker import batch_indices, worker_main
from ctr_model.metrics import roc_auc


def torch_uniform(fan_in: int) -> Callable[..., jax.Array]:
    """Flax initialiser matching torch `nn.Linear` (weights and bias): U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / np.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class MLP(nn.Module):
    """Dense(256) → act → Dropout(0.3) → Dense(128) → act → Dropout(0.2) → Dense(1): `CTRNet` in Flax."""

    in_features: int = 128
    hidden: tuple[int, int] = (256, 128)
    dropout: tuple[float, float] = (0.3, 0.2)
    activation: str = "relu"  # or "hardtanh", as `ModelConfig.activation`

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        fan_in = self.in_features
        for width, rate in zip(self.hidden, self.dropout, strict=True):
            x = nn.Dense(width, kernel_init=torch_uniform(fan_in), bias_init=torch_uniform(fan_in))(x)
            act = nn.relu(x) if self.activation == "relu" else nn.hard_tanh(x)
            x = nn.Dropout(rate, deterministic=not train)(act)
            fan_in = width
        return nn.Dense(1, kernel_init=torch_uniform(fan_in), bias_init=torch_uniform(fan_in))(
            x
        )  # (B, 1) logits


def train_once(
    d: dict[str, np.ndarray], epochs: int, batch_size: int, lr: float, seed: int
) -> tuple[float, float]:
    """Train a fresh model; returns (steady samples/s, val AUC)."""
    model = MLP(in_features=d["train_x"].shape[1])
    key = jax.random.PRNGKey(seed)
    key, init_key = jax.random.split(key)
    params = model.init(init_key, jnp.zeros((1, d["train_x"].shape[1])), train=False)
    tx = optax.adam(lr)
    opt_state = tx.init(params)
    x_all = jax.device_put(d["train_x"])  # (N, 128): gathered per batch inside the jitted step
    y_all = jax.device_put(d["train_y"].reshape(-1, 1))  # (N, 1)

    @partial(jax.jit, donate_argnums=(0, 1))
    def step(params: Any, opt_state: Any, idx: jax.Array, key: jax.Array) -> tuple[Any, Any, jax.Array]:
        key, dropout_key = jax.random.split(key)

        def loss_fn(p: Any) -> jax.Array:
            logits = model.apply(p, x_all[idx], train=True, rngs={"dropout": dropout_key})
            return optax.sigmoid_binary_cross_entropy(logits, y_all[idx]).mean()

        grads = jax.grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, key

    rng = np.random.default_rng(seed)
    seconds = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        for idx in batch_indices(len(d["train_y"]), batch_size, rng):
            params, opt_state, key = step(params, opt_state, idx, key)
        jax.block_until_ready(params)
        seconds.append(time.perf_counter() - t0)
    logits = jax.jit(partial(model.apply, train=False))(params, d["val_x"])
    timed = seconds[1:] or seconds
    return len(d["train_y"]) * len(timed) / sum(timed), roc_auc(d["val_y"], np.asarray(logits).reshape(-1))


def about() -> dict[str, Any]:
    """The row's package versions and the device JAX ran on."""
    import importlib.metadata as m

    versions = {name: m.version(name) for name in ("jax", "flax", "optax")}
    return {"versions": versions, "device": str(jax.devices()[0])}


def main(argv: list[str] | None = None) -> None:
    worker_main("jax", __doc__ or "", train_once, about, argv)


if __name__ == "__main__":
    main()
