"""The events/s sweep of `make bench-loadgen` and the native mock it measures against."""
