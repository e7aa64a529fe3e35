"""How the spec is edited: config.json read and written, and the small composable modifiers
(mounts, devices, env, hooks, seccomp) and rootfs checks that make a GPU container of it."""
