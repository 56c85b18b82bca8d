"""Targets: one module per server protocol the load generator speaks, the protocol they all
follow and their registry (target.py), the client that streams one request through any of them,
timed (client.py), and the pieces several share (gRPC streaming, server-sent events, token
counting of text-only streams, credentials)."""
