"""The interval-service core the online trainer, live evaluation and the rollout controller share: the interval
clock, a typed durable state file, the run loop (until, intervals, SIGTERM) and the shared flags."""
