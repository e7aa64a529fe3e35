"""The node model: the GPUs found here (discovery and its cache) and the shared
regions libvgpu keeps per container. Imports only the base package."""
