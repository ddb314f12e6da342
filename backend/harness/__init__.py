"""The harness: one case through a session of graphs, its steps, checks and verdict (Ray-free)."""
