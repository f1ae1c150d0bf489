"""Scale-out: the worker agent, the router, the session directory (memory, Redis), live
migration and the hand-off between workers."""
