"""How commands are served: runc's command line dispatched to the commands, and the create
server (with its warm-up) that runs creates for the C launcher. The top room."""
