/* The launcher's side of the create server (hami_runtime/lifecycle/serving/create_server.py). */
#ifndef HAMI_LAUNCHER_SERVER_CLIENT_H
#define HAMI_LAUNCHER_SERVER_CLIENT_H

#include <stddef.h>

/* Under the state dir: the server's socket, and the lock its one server holds. */
#define SERVER_DIR "server"
#define SERVER_SOCKET SERVER_DIR "/socket"
#define SERVER_LOCK SERVER_DIR "/lock"

enum served { NOT_SERVED = -1, SERVED_EXIT = 0, SERVED_EXEC = 1 };

/* Sends argv, this process's env, cwd and umask, and `fds` as its stdin, stdout
 * and stderr, to the server at `socket_path`, and reads the answer:
 * SERVED_EXEC (the runtime to exec, in `runtime`), SERVED_EXIT (`*status`),
 * or NOT_SERVED (no server answered within 2 s, it declined, or the listener
 * is not this node's create server: the caller runs the command itself).
 * Nothing is sent to a listener that is not the node's own server (its
 * process, its namespaces, its program and its lock are checked first); such
 * a listener is named in the runtime's log. */
int server_request(const char *socket_path, char **argv, const int fds[3],
                   char *runtime, size_t size, int *status);

#endif
