"""The forwarder that runs inside a sandbox with egress: it offers the daemon's proxy socket
(``/run/sandboxd/egress.sock``) as ``127.0.0.1:3128``, where ``HTTP_PROXY`` points, and does
nothing else (it holds no secret and decides nothing: the proxy outside does). Standard
library only, one process, one select loop; the daemon copies this file into the
container's runner directory and starts it with ``docker exec`` as the sandbox's user. If
sandboxed code kills it, that sandbox loses its own egress, nothing more.

Run as ``python3 -I -S forwarder.py SOCKET PORT``.
"""

import selectors
import socket
import sys

READY_LINE = b"SANDBOXD-EGRESS-FORWARDER READY\r\n\r\n"
CHUNK = 64 * 1024
#: a guard of the forwarder's own descriptors (the container's NOFILE is 1024); the rule a
#: sandbox meets is the proxy's (sandboxd.egress.proxy.MAX_CONNECTIONS, below this)
MAX_PAIRS = 256


def _unix(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def peers_of(key: selectors.SelectorKey) -> tuple[socket.socket, socket.socket]:
    src = key.fileobj
    assert isinstance(src, socket.socket)
    return src, key.data


def _accept(listener: socket.socket, path: str, sel: selectors.BaseSelector,
            peers: dict[socket.socket, socket.socket]) -> None:
    """Pair a new local client with its own connection to the proxy socket (the client is
    closed at :data:`MAX_PAIRS`, or when the proxy socket cannot be reached)."""
    try:
        client, _addr = listener.accept()
    except OSError:
        return
    if len(peers) >= 2 * MAX_PAIRS:
        client.close()
        return
    try:
        up = _unix(path)
    except OSError:
        client.close()
        return
    for a, b in ((client, up), (up, client)):
        a.setblocking(True)
        peers[a] = b
        sel.register(a, selectors.EVENT_READ, b)


def _pump(key: selectors.SelectorKey, sel: selectors.BaseSelector,
          peers: dict[socket.socket, socket.socket]) -> None:
    """Pass what one side sent to its peer; at its end (or an error either way) close both."""
    src, dst = peers_of(key)
    try:
        data = src.recv(CHUNK)
    except OSError:
        data = b""
    if data:
        try:
            dst.sendall(data)
            return
        except OSError:
            pass
    for s in (src, dst):
        if s in peers:
            sel.unregister(s)
            del peers[s]
            s.close()


def main(argv: list[str]) -> int:
    path, port = argv[1], int(argv[2])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    listener.setblocking(False)
    hello = _unix(path)  # tells the daemon the sandbox may now use its proxy
    hello.sendall(READY_LINE)
    hello.close()
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    peers: dict[socket.socket, socket.socket] = {}
    while True:
        for key, _ in sel.select():
            if key.data is None:
                _accept(listener, path, sel, peers)
            else:
                _pump(key, sel, peers)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
