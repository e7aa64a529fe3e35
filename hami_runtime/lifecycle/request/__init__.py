"""What the container asks: its annotations, env and pod identity read into one request
(memory, cores, devices, policy) and the checks on it. Imports nothing of the other rooms."""
