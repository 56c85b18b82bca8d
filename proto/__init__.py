"""Generated gRPC code for proto/moe.proto (made by `make proto`)."""
