"""SLA mode (`--mode sla`, docs/sla.md): the search that decides each probe (search.py), from a
start its ramp finds (ramp.py), each probe watched and judged (watch.py) over what sends it
(probes.py); each sending process's part of a probe (part.py), and the messages between the
search and the senders in other processes: a distributed run's workers, the aio sender
(remote.py)."""
