"""The server's front ends: the gRPC service and its GetStats reply, the OpenAI-compatible HTTP API,
admission shared by both, TLS and tokens, the status each domain error gets, and the Prometheus
endpoint. The only part of the server that knows gRPC or HTTP."""
