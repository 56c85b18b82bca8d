"""Expert parallelism's machinery: the process group of the ranks, an MoE layer's exchange between
them, where the experts are placed and the model of the link. The engine imports it; it imports
nothing of the engine."""
