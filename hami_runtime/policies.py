"""The SM core policies a request, the node config or hamictl update may name:
libvgpu's GPU_CORE_UTILIZATION_POLICY values (region.h numbers them HAMI_POLICY_*)."""
CORE_POLICIES = ("default", "force", "disable")
