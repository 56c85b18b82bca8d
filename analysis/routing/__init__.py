"""The MoE view of a foreign run: the routed experts a server returned, the engines' own expert
statistics, and what our batching and placement would do with them (docs/analysis.md)."""
