"""The data room: `--data` (text or Parquet) to Parquet, the fitted and encoded splits, then batches per rank."""
