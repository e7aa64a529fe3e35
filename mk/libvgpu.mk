# libvgpu.so: owned by the libvgpu part (placeholder until it lands).
