"""The model room: the pure network, the LightningModule around it, checkpoints, warm start, DDP, metrics."""
