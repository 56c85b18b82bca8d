"""Scheduling: the engine thread, the continuous-batching loop it runs one step at a time, the
requests it carries, the batching policies, fair admission across clients, injected faults and
the heap trims between steps. Knows the engine through its protocol (server/engine/interface.py),
nothing of the front ends."""
