"""A minimal AMQP 0-9-1 client on a plain socket, for what pika will not send: wrong protocol
headers, AMQPLAIN, unknown methods, frames on unopened channels, content without a method,
oversized and malformed frames. Frames are built and parsed with pika's own codec
(pika.frame, pika.spec); only deliberately broken frames are put together by hand.

Used by diff.py's `wire_*` sessions; everything returns JSON-ready observations."""

import socket
import struct
import time
import urllib.parse

import pika.data
import pika.frame
import pika.spec

from common import SOCKET_TIMEOUT

PROTOCOL_HEADER = b'AMQP\x00\x00\x09\x01'
FRAME_END = b'\xce'
WAIT = 5.0
EOF = 'socket closed'  # what read_frame returns when the broker closed the socket


def raw_frame(frame_type, channel, payload, end=FRAME_END):
    return struct.pack('>BHI', frame_type, channel, len(payload)) + payload + end


def method_payload(class_id, method_id, arguments=b''):
    return struct.pack('>HH', class_id, method_id) + arguments


def amqplain(user, password):
    """An AMQPLAIN response: a field table without its length prefix."""
    pieces = []
    pika.data.encode_table(pieces, {'LOGIN': user, 'PASSWORD': password})
    return b''.join(pieces)[4:]


class RawConnection:
    """A socket speaking AMQP frames; `observe` reads until the broker closes something."""

    def __init__(self, url):
        parts = urllib.parse.urlsplit(url)
        self.user = urllib.parse.unquote(parts.username or 'guest')
        self.password = urllib.parse.unquote(parts.password or 'guest')
        self.vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else '/'
        self.sock = socket.create_connection((parts.hostname, parts.port or 5672),
                                             timeout=SOCKET_TIMEOUT)
        self.buffer = b''
        self.frame_max = 131072

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data):
        """Sends; a broker that already closed the socket shows up in the next read."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def send_method(self, channel, method):
        self.send(pika.frame.Method(channel, method).marshal())

    def read_bytes(self, timeout=WAIT):
        """Whatever arrives within timeout; b'' once the broker closed the socket."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(65536)
        except socket.timeout:
            return None
        except ConnectionResetError:  # the broker closed it first (and we had sent more)
            return b''
        finally:
            self.sock.settimeout(SOCKET_TIMEOUT)

    def read_frame(self, timeout=WAIT):
        """The next frame, or EOF when the socket closed, or None after timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            consumed, frame = pika.frame.decode_frame(self.buffer)
            if frame is not None:
                self.buffer = self.buffer[consumed:]
                return frame
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            data = self.read_bytes(left)
            if data is None:
                return None
            if not data:
                return EOF
            self.buffer += data

    def expect(self, method_class):
        frame = self.read_frame()
        if not (isinstance(frame, pika.frame.Method) and isinstance(frame.method, method_class)):
            raise ConnectionError(f'expected {method_class.NAME}, got {describe(frame)}')
        return frame.method

    def handshake(self, mechanism='PLAIN', response=None, auth_failure_close=True, heartbeat=0):
        """Protocol header to Connection.Open; returns (Connection.Start, the answer to Open or
        whatever came instead of Tune). Announces the client capabilities pika announces,
        authentication_failure_close included unless told not to."""
        self.send(PROTOCOL_HEADER)
        start = self.expect(pika.spec.Connection.Start)
        if response is None:
            response = f'\0{self.user}\0{self.password}'.encode()
        capabilities = {'authentication_failure_close': auth_failure_close,
                        'basic.nack': True, 'connection.blocked': True,
                        'consumer_cancel_notify': True, 'publisher_confirms': True}
        self.send_method(0, pika.spec.Connection.StartOk(
            client_properties={'product': 'qqdiff rawwire', 'capabilities': capabilities},
            mechanism=mechanism, response=response, locale='en_US'))
        tune = self.read_frame()
        if not (isinstance(tune, pika.frame.Method)
                and isinstance(tune.method, pika.spec.Connection.Tune)):
            return start, tune
        self.frame_max = tune.method.frame_max
        self.send_method(0, pika.spec.Connection.TuneOk(
            channel_max=tune.method.channel_max, frame_max=tune.method.frame_max,
            heartbeat=heartbeat))
        self.send_method(0, pika.spec.Connection.Open(virtual_host=self.vhost))
        return start, self.read_frame()

    def open_channel(self, channel):
        self.send_method(channel, pika.spec.Channel.Open())
        return self.expect(pika.spec.Channel.OpenOk)

    def observe(self, timeout=WAIT):
        """Frames until the broker closes the connection or a channel (answering with the
        CloseOk), or the socket ends, or nothing comes for timeout seconds."""
        seen = []
        while True:
            frame = self.read_frame(timeout)
            if frame is None:
                seen.append('nothing more')
                return seen
            if isinstance(frame, str):  # EOF
                seen.append(EOF)
                return seen
            seen.append(describe(frame))
            if isinstance(frame, pika.frame.Method):
                if isinstance(frame.method, pika.spec.Connection.Close):
                    self.send_method(0, pika.spec.Connection.CloseOk())
                    timeout = WAIT  # then the broker closes the socket
                elif isinstance(frame.method, pika.spec.Channel.Close):
                    self.send_method(frame.channel_number, pika.spec.Channel.CloseOk())
                    return seen


def describe(frame):
    if frame is None or isinstance(frame, str):
        return frame
    if isinstance(frame, pika.frame.Method):
        fields = {k: v for k, v in vars(frame.method).items() if not k.startswith('_')}
        fields.pop('server_properties', None)  # recorded by the server_properties session
        fields = {k: printable(v) for k, v in fields.items()}
        return {'channel': frame.channel_number, 'method': frame.method.NAME, 'fields': fields}
    if isinstance(frame, pika.frame.ProtocolHeader):
        return {'protocol-header': [frame.major, frame.minor, frame.revision]}
    return {'frame': type(frame).__name__, 'channel': frame.channel_number}


def printable(value):
    if isinstance(value, bytes):
        try:
            return value.decode('utf-8')
        except UnicodeDecodeError:
            return {'hex': value.hex()}
    return value
