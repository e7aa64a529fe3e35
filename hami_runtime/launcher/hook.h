/* The createRuntime hook, run by the launcher as `hami-runtime hami-hook ...`. */
#ifndef HAMI_LAUNCHER_HOOK_H
#define HAMI_LAUNCHER_HOOK_H

#define HOOK_SUBCOMMAND "hami-hook"
/* The environment variable that tells the Python runtime which launcher
 * started it, so that the createRuntime hook it writes can be this program. */
#define LAUNCHER_ENV "HAMI_LAUNCHER"
/* Set with it: when the launcher started (CLOCK_MONOTONIC, ns), so that a
 * create's debug trace counts the launcher's part (hami_runtime/phases.py). */
#define LAUNCHER_STARTED_ENV "HAMI_LAUNCHER_STARTED_NS"
/* Set for the detached release the launcher starts after runc's delete: the
 * Python runtime then only frees (it never frees a live container). */
#define DELETE_DONE_ENV "HAMI_DELETE_DONE"
/* Set for the detached warm-up a create that asks for no GPU starts on a fresh
 * state dir (with the create server off): the Python runtime then only fills
 * its caches (cli.py). */
#define WARM_UP_ENV "HAMI_WARM_UP"
/* Set for the create server the launcher starts (create_server.py). */
#define SERVER_ENV "HAMI_CREATE_SERVER"

/* argv after the subcommand; returns the exit status. */
int hook_main(int argc, char **argv);

#endif
