/*
 * Which pid NVML shows for a process of the simulated machine (sim_pids.c).
 */
#ifndef HAMI_SIM_PIDS_H
#define HAMI_SIM_PIDS_H

#include "sim.h"

/* sim_proc_slot.host_pid_known */
#define SIM_HOST_PID_OWN 1     /* host_pid is what the process itself found: its own (host namespace) or the pid service's answer */
#define SIM_HOST_PID_FOUND 2   /* host_pid was found by a reader in the host's namespace (/proc); the process does not know it */

/* What a reader sees of a process of another pid namespace whose host pid nobody found
 * yet: this plus its slot, above PID_MAX_LIMIT (2^22), so no process has it. */
#define SIM_PID_UNSEEN 4194304u

/* The pid NVML shows this reader for the process of slot `slot`. */
uint32_t sim_pid_shown(struct sim_state *s, int slot);
/* The pid NVML shows this reader for a kernel that slot `slot` booked as `pid`. */
uint32_t sim_interval_pid(struct sim_state *s, uint32_t pid, uint32_t slot);
/* In the host's pid namespace: finds the host pid of each live process of another namespace
 * that does not know its own (no pid service answered it) and records it in its slot.
 * Reads /proc; call it without the state lock. */
void sim_pids_resolve(struct sim_state *s);

#endif
