"""The fabric as data: the topology model every layer above the switch reads (``model``), the
topology file that writes it down (``file``: TOML, validated, each error naming its key) and the
generators of the shipped shapes (``generate``: single switch, leaf-spine, fat-tree, Meta's AI
zone).  No process, socket or clock."""
