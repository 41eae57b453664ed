"""The fabric of processes and its virtual twin: the node processes (host agents, host
services), the local supervisor, the exact and the virtual runs, flow jobs and reports, the
changes of links at emulated instants and fault control, the rendezvous store's node."""
