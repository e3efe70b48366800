"""The dispatch core: the fast path, its plans and jobs, the watches and waiters, compiled and in
Python."""
