"""The operator tools: hamictl and its top, metrics and doctor commands. They read
the create path's state and the node model; nothing there imports them."""
