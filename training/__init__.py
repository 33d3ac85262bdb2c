"""Training: Criteo rows -> a run directory (checkpoints, feature spec, export's samples). `python -m training`.

Rooms: `data/` (`--data` to batches), `features/` (the FeatureSpec and its fit), `model/` (the network, the
LightningModule, checkpoints, DDP), `tune/` (`python -m training.tune`). Top level: the CLI, `TrainConfig`, one
run (`train.py`), the errors, and the data tools `synth` and `request_log_to_criteo`.
"""
