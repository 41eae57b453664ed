"""The collectives' library, what a training script imports: the rendezvous store, links,
ring schedules, placement, the session, the Communicator, reduction ops and metrics.  It
imports nothing else of :mod:`collectives`."""
