"""The click join as an Apache Flink job, equal to the embedded join (docs/flink-join.md)."""
