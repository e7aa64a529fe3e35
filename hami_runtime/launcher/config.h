/* The keys of the node config the launcher reads itself (config.c). */
#ifndef HAMI_LAUNCHER_CONFIG_H
#define HAMI_LAUNCHER_CONFIG_H

#include <limits.h>
#include <stddef.h>

/* The interpreter the launcher runs (make build and make install set it); the create server is one. */
#ifndef HAMI_PYTHON
#define HAMI_PYTHON "/usr/bin/python3"
#endif

#define MAX_CANDIDATES 16
#define DEFAULT_STATE_DIR "/run/hami" /* hami_runtime/config_cache.py */
#define DEFAULT_SERVER_IDLE_S 300     /* hami_runtime/config_model.py */

/* The `runtime` candidates: 0 found, 1 absent (use the defaults), -1 not understood. */
int config_runtimes(char cands[][PATH_MAX], int *count);

/* The `state_dir`: 0 found, 1 absent (DEFAULT_STATE_DIR), -1 not understood. */
int config_state_dir(char *out, size_t size);

/* `create_server_idle_s`: its value (DEFAULT_SERVER_IDLE_S if absent), -1 not understood. */
int config_server_idle_s(void);

/* `log_file` into out where warnings go there (`log_level` is not "error"): 0, else -1. */
int config_warning_log(char *out, size_t size);

#endif
