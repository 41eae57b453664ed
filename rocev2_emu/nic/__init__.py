"""The software NIC: its sans-IO core (resources, frame dispatch, a PFC-aware paced egress,
a slow receiver's ingress buffer) in ``core`` and ``ingress``, the trio driver that pumps it in
``driver``, and its Prometheus collector in ``metrics``."""
