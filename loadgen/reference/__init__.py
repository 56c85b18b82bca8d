"""The known-delay reference servers (`python -m loadgen.delay_server`): one per protocol a target
speaks, all following one schedule (pacer.py), so the load generator's numbers can be checked
against the truth."""
