"""Scale-out: a group of devices on one loop, replicated arrays, and pools of Ray actors."""
