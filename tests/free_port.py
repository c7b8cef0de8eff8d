#!/usr/bin/env python3
"""Print a TCP port free on 127.0.0.1 that the kernel does not hand out to outgoing connections.

A port from bind(("127.0.0.1", 0)) is in the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range):
free when asked, but another process's outgoing connection can take it as its local port before the
test's server binds it, which then fails with "Address already in use" (pretrain_graph_small's console
port, about one run in eight). So: a random free port in the 12000 ports below that range.
"""
import random
import socket

try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except OSError:
    low = 32768
for port in random.sample(range(max(1024, low - 12000), low), 500):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("free_port.py: no free port below the ephemeral range")
