"""What every process of the fabric runs on: the dilated clock, datagram ports (UDP or
in memory), link faults, the one pump loop, the event engines of virtual and exact runs with the
coordinator's windows, and node metrics.  With the control plane below it, the only layers below
the shells that import trio and socket."""
