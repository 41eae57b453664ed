"""The control plane every process shares: the fabric secret and the proof of it, the
length-prefixed msgpack channel and the request loop of every control server, requests as typed
tables, and the rendezvous store's core.  Below the runtime; imports nothing of the fabric."""
