"""Lesson 10: reference solutions."""


def recv_exactly(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"peer closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def ps_bytes_per_clock(counts, P):
    return sum(4 * c * (P - 1) / P * 2 for c in counts)
