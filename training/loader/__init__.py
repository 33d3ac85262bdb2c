"""What the Trainer iterates: the run's inputs, the DataModule, and the two loaders of `--loader memory|stream`."""
