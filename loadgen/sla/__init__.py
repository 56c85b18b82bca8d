"""SLA mode (`--mode sla`, docs/sla.md): the search that decides each probe (search.py), each
sending process's part of a probe (part.py), and the messages between a distributed run's
master, which decides, and its workers, which send (remote.py)."""
