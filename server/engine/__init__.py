"""The engine: a PyTorch MoE transformer and everything one forward pass needs (KV slots, the MoE
layer and its kernels, routers, the expert cache, checkpoint loading, tokenizers, host
transfers, stage timing), in one process or over the ranks of expert parallelism. Imports
nothing of scheduling or the front ends."""
