"""The unit under test: a graph-enabled paged attention backend (four roles, several kernel
providers), the graph runners (real CUDA/HIP graphs and CPU emulation), the test model and the
checker. Free of Ray: a case runs the same in a plain process, under pytest or in an actor."""
