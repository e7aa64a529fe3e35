"""What the node holds: the state dir, the allocations under their lock, pods' ledgers, the
activity and priority boards, and each container's files. Reads requests, never edits a spec."""
