"""The RC transport core (sans-IO): the QP state table, requester and responder with
go-back-N recovery, memory regions and keys, work requests and completions, per IBTA vol. 1
ch. 9-11.  Time is the ``now`` argument; no trio, socket or clock."""
