"""Training across machines (Poseidon's setting): nodes joined by a network, each node a
SingleCaffe process (worker threads), together one sharded parameter server.

    frames.py      the wire format: a fixed 48-byte header, then a tensor's raw bytes
    transport.py   the Transport interface the algorithms use; shared secret + HMAC handshake;
                   the token-bucket link emulator; byte counters
    sockets.py     the socket transport: rendezvous, a TCP mesh, a sender and a receiver thread
                   per peer, heartbeats, a listener that refuses strangers
    ps.py          the sharded parameter server and the node runtime (1/P of every blob per node,
                   the Solver's own update rule on each shard; BSP or SSP).  Its docstring names
                   the per-layer extension point ("sync this layer now", "wait for its params")

The protocol, step by step, is in docs/DISTRIBUTED.md.
"""
