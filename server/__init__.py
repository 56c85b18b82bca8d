"""The MoE inference server: gRPC service -> scheduler -> engine -> model."""
