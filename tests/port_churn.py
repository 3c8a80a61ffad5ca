"""A hostile neighbour for the rendezvous test: takes nearly every port the OS hands out to bind(0) and keeps
re-taking them, releasing a few at random each round, and opens and closes connections meanwhile. A port that an
evaluator frees and means to bind again later is taken within milliseconds, as happens on a busy machine.

    python tests/port_churn.py SECONDS
"""
import random
import resource
import socket
import sys
import time

SPARE_DESCRIPTORS = 512
# Held at most: Linux's default ephemeral range has ~28,000 ports; leaving ~12,000 free keeps other processes'
# connections possible while any port an evaluator frees is still taken again within milliseconds.
MOST_HELD = 16_000


def main(seconds: float) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    capacity = max(min(hard - SPARE_DESCRIPTORS, MOST_HELD), 64)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    held: list = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        while len(held) < capacity:
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", 0))
            except OSError:
                sock.close()
                break
            held.append(sock)
        random.shuffle(held)
        for _ in range(max(len(held) // 100, 1)):
            held.pop().close()
        for _ in range(10):  # outgoing connections take ephemeral ports too
            out = socket.create_connection(listener.getsockname())
            accepted, _ = listener.accept()
            out.close()
            accepted.close()
        time.sleep(0.001)


if __name__ == "__main__":
    main(float(sys.argv[1]))
