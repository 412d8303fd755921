"""What clients.py and diff.py share: connection parameters and a hard deadline for any block of
code, so that a broker that never answers fails a case instead of hanging the test."""

import contextlib
import signal
import time

import pika

SOCKET_TIMEOUT = 10.0      # every socket connect, read and write of pika


class Deadline(BaseException):
    """A block ran past its deadline. A BaseException, so that pika's own `except Exception`
    handlers (in its I/O loop) cannot swallow it on the way out."""


def parameters(url):
    """pika connection parameters with timeouts everywhere and no retries."""
    params = pika.URLParameters(url)
    params.socket_timeout = SOCKET_TIMEOUT
    params.stack_timeout = 2 * SOCKET_TIMEOUT
    params.blocked_connection_timeout = 30
    params.connection_attempts = 1
    return params


@contextlib.contextmanager
def deadline(seconds, what):
    """Raises Deadline inside the block when it runs longer than `seconds` (SIGALRM; main
    thread only). Nests: an inner deadline never outlives the outer one, which is restored."""
    outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
    outer_handler = signal.getsignal(signal.SIGALRM)

    def expire(_signum, _frame):
        raise Deadline(f'{what}: no progress within {seconds:g}s')

    started = time.monotonic()
    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer_left) if outer_left else seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_left:
            left = outer_left - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))
