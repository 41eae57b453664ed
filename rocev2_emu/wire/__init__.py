"""The wire: frame codecs (VXLAN, Ethernet II, IPv4, UDP, BTH and its extension headers,
ICRC, 802.1Qbb PFC), line-rate timing and pcap, following RFC 7348, IEEE 802.1Qbb and the IBTA
RoCEv2 annex.  Sans-IO: no trio, socket or clock; decoders raise only ``MalformedFrame``."""
