"""The fast dropout (`fast_dropout`: a MaskedDropout with numpy-drawn masks): nn.Dropout's statistics (keep probability, scale, eval identity)."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ctr_model.dropout import MaskedDropout
from ctr_model.net import CTRNet
from training.runtime.fast_dropout import fast_dropout, numpy_mask

MILLION = 1 << 20


@pytest.mark.parametrize("p", [0.3, 0.2])
def test_kept_fraction_is_within_three_sigma_of_one_minus_p(p: float) -> None:
    torch.manual_seed(0)
    out = fast_dropout(p).train()(torch.ones(1024, 1024))
    kept = float((out != 0).double().mean())
    sigma = math.sqrt(p * (1 - p) / MILLION)
    assert abs(kept - (1 - p)) < 3 * sigma


@pytest.mark.parametrize("p", [0.3, 0.2])
def test_kept_values_are_scaled_by_one_over_one_minus_p(p: float) -> None:
    x = torch.randn(512, 256)
    out = fast_dropout(p).train()(x)
    kept = out != 0
    assert torch.allclose(out[kept], x[kept] * (1 / (1 - p)), rtol=1e-6, atol=0)


def test_backward_passes_the_same_mask_and_scale() -> None:
    x = torch.randn(256, 64, requires_grad=True)
    out = fast_dropout(0.3).train()(x)
    out.sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad, (out != 0).float() / 0.7)


def test_eval_mode_is_the_identity() -> None:
    x = torch.randn(64, 32)
    assert fast_dropout(0.3).eval()(x) is x


def test_masks_differ_across_steps() -> None:
    torch.manual_seed(5)
    drop = fast_dropout(0.3).train()
    first, second = drop(torch.ones(256, 256)), drop(torch.ones(256, 256))
    assert not torch.equal(first, second)


def test_same_seed_gives_the_same_masks() -> None:
    drop = fast_dropout(0.3).train()
    torch.manual_seed(7)
    a = [drop(torch.ones(128, 128)) for _ in range(3)]
    torch.manual_seed(7)
    b = [drop(torch.ones(128, 128)) for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _rank_mask(rank: int, port: int, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(42)  # what L.seed_everything does on every rank
        torch.save(fast_dropout(0.3).train()(torch.ones(256, 256)), out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_masks_differ_across_ddp_ranks_with_the_same_seed(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_mask, args=(port, tmp_path), nprocs=2, join=True)
    m0, m1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert not torch.equal(m0, m1)
    assert float((m0 != 0).float().mean()) == pytest.approx(0.7, abs=0.02)


def test_fast_dropout_net_has_the_torch_net_state_dict_keys_and_positions() -> None:
    fast, plain = CTRNet(mask_source=numpy_mask), CTRNet()
    assert list(fast.state_dict()) == list(plain.state_dict())
    assert [i for i, m in enumerate(fast.layers) if isinstance(m, MaskedDropout)] == [2, 5]
    assert all(isinstance(m, nn.Dropout) for m in (fast.layers[2], fast.layers[5]))
    assert (fast.layers[2].p, fast.layers[5].p) == (0.3, 0.2)
