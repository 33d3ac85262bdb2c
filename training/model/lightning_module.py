"""The LightningModule: loss, optimiser and validation metrics around the pure `CTRNet` (held as `self.net`)."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import SumMetric
from torchmetrics.classification import BinaryAUROC

from ctr_model.net import CTRNet, ModelConfig
from training.errors import NonFiniteLossError
from training.loader.memory import Batch
from training.runtime.fast_dropout import numpy_mask

ADAM_IMPLS = (
    "default",
    "foreach",
    "fused",
)  # resolved ones; `training.runtime.speed` turns "auto" into one of these


class CTRModule(L.LightningModule):
    """BCE-with-logits on (B, 128) features; validation AUC and log loss synced across ranks.

    Args:
        model: `ModelConfig.to_dict()`; saved as `hyper_parameters["model"]` (the checkpoint contract).
        lr: Adam learning rate.
        weight_decay: Adam L2 penalty.
        adam_impl: "default", "foreach" or "fused" (torch's Adam implementations; same maths).
        fast_dropout: installs the numpy-drawn CPU dropout masks (`training.runtime.fast_dropout.numpy_mask`) in
            the network; same keep probabilities, same state_dict.
        negative_sample_rate: the share w of training negatives the run keeps (`training.loader.negatives`);
            saved as `hyper_parameters["negative_sample_rate"]`, which export reads to serve sigmoid(z + ln w).
            The validation log loss is of that corrected probability (the validation rows are not sampled);
            AUC does not change with it.
    """

    def __init__(
        self,
        model: dict[str, Any],
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        adam_impl: str = "default",
        fast_dropout: bool = False,
        negative_sample_rate: float = 1.0,
    ) -> None:
        super().__init__()
        if adam_impl not in ADAM_IMPLS:
            raise ValueError(f"adam_impl must be one of {ADAM_IMPLS}, got {adam_impl!r}")
        self.save_hyperparameters()
        self.logit_shift = math.log(
            negative_sample_rate
        )  # ln w: undoes the prior shift of the sampled negatives
        self.net = CTRNet(ModelConfig.from_dict(model), mask_source=numpy_mask if fast_dropout else None)
        # torchmetrics states are gathered from every rank before compute(), so AUC is over the whole val set.
        self.val_auc = BinaryAUROC()
        self.val_loss_sum = SumMetric()
        self.val_count = SumMetric()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # (B, 128) -> (B, 1) logits

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        x, y, _ = batch
        loss = F.binary_cross_entropy_with_logits(self.net(x), y)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(
                f"training loss is {loss.item()} at global step {self.global_step} (epoch {self.current_epoch}, "
                f"batch {batch_idx}); stopped before the optimizer step and before any checkpoint of this state. "
                f"Lower --lr (now {self.hparams['lr']}) or check the input features."
            )
        # `self.log` runs Lightning's result bookkeeping in Python on every call, so it runs only on the steps whose
        # value the logger writes (every `log_every_n_steps`); the progress bar's loss refreshes as often.
        every = int(getattr(self.trainer, "log_every_n_steps", 1))  # set on the Trainer at run time
        if every and (self.global_step + 1) % every == 0:
            self.log("train_loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        x, y, _ = batch
        logits = self.net(x)  # (B, 1)
        if self.logit_shift:  # corrected to the unsampled click rate, in fp32 (ln w is not exact in bf16)
            logits = logits.float() + self.logit_shift
        self.val_auc.update(torch.sigmoid(logits).squeeze(1), y.squeeze(1).long())
        self.val_loss_sum.update(F.binary_cross_entropy_with_logits(logits, y, reduction="sum"))
        self.val_count.update(torch.tensor(float(y.shape[0])))

    def on_validation_epoch_end(self) -> None:
        auc = self.val_auc.compute()
        logloss = self.val_loss_sum.compute() / self.val_count.compute()
        for metric in (self.val_auc, self.val_loss_sum, self.val_count):
            metric.reset()
        if self.trainer.sanity_checking:
            return
        bad = [n for n, p in self.net.named_parameters() if not torch.isfinite(p).all()]
        if bad or not torch.isfinite(logloss):
            raise NonFiniteLossError(
                f"validation log loss is {logloss.item()} after global step {self.global_step} (epoch {self.current_epoch}); "
                f"non-finite weights: {bad or 'none'}. Stopped before checkpointing. Lower --lr (now {self.hparams['lr']})."
            )
        # Values are already global (torchmetrics synced them); sync_dist only keeps Lightning's checks quiet.
        self.log("val_auc", auc, prog_bar=True, sync_dist=True)
        self.log("val_logloss", logloss, prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        impl = self.hparams["adam_impl"]
        kwargs: dict[str, Any] = (
            {"foreach": True} if impl == "foreach" else {"fused": True} if impl == "fused" else {}
        )
        return torch.optim.Adam(
            self.net.parameters(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"], **kwargs
        )
