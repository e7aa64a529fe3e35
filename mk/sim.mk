# Simulated driver: owned by the simulated-GPU part (placeholder until it lands).
sim:
