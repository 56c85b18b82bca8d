"""Records that cross a boundary, declared once: the server's and the load generator's settings,
and the run directory's files. Server, load generator and analysis all import this package; it
imports none of them (docs/design.md)."""
