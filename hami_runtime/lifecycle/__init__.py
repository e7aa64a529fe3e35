"""The create path: what create/run and delete do to one container, in rooms by role, read
as a create runs: request → node_state and spec_edit → commands → serving. A room imports only
the rooms before it (node_state and spec_edit not each other); all of them import the base and
the node model, never the tools."""
