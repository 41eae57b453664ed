"""What every process of the fabric runs on: the dilated clock, datagram ports (UDP or
in memory), link faults, the one pump loop, control-plane framing and node metrics.  The only
layer below the shells that imports trio and socket."""
