"""The model room: the pure network (and its fast CPU dropout), the LightningModule around it, the speed settings, checkpoints, warm start, DDP, metrics."""
