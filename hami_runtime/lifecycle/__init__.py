"""The create path: what create/run and delete do to one container (its request,
its allocation in the store, the spec edits). Imports the base and the node model, never the tools."""
