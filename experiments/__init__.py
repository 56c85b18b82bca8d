"""Experiments that run the server and the load generator as processes, as a user would from
the shell, and judge what they measured with the analysis package: the batching-policy
comparison (`make compare`, docs/compare.md)."""
