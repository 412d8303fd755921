#!/usr/bin/env python3
"""Differential AMQP 0-9-1 test: the same scripted pika sessions against two brokers.

    diff.py record URL OUT.json [--only SESSION]
    diff.py compare A.json B.json [--common] [--allow tests/amqp/known-differences.json]
    diff.py setup-rabbitmq [--ctl 'bash bench/rabbitmq.sh ctl 1']
    diff.py list

`record` runs every session against URL and writes a JSON transcript of everything a client can
observe: for each step the method reply, or the channel or connection close (reply code and
text), or what pika raised (basic.return, basic.nack); every message delivered or got, with its
method fields, all 14 basic properties, and headers decoded from the wire with their AMQP field
type tags (so a long-long `l` and a long `I` differ, as they do on the wire). Only what must
differ between runs is normalised: x-death `time` becomes "<time>", and the broker's identity
(product, version, ...) is recorded as it is but allow-listed in compare.

`compare` flattens both transcripts to `path: value` lines and prints every difference; it
exits 1 when a difference is not matched by an entry of the allow-list (fnmatch patterns on
the path, each with its reason).

The permission sessions need two users besides the URL's: `qqdiff-noconf` (password
`qqdiff-noconf`; on vhost `/` configure nothing, write and read everything) and `qqdiff-novhost`
(password `qqdiff-novhost`; no permissions at all). `setup-rabbitmq` creates them with
rabbitmqctl. The same users on quorumq (as an administrator, e.g. guest):

    qqctl put-user qqdiff-noconf --new-password qqdiff-noconf
    qqctl --vhost / set-permissions qqdiff-noconf --configure ''    # --write/--read default .*
    qqctl put-user qqdiff-novhost --new-password qqdiff-novhost

Every session uses fixed names starting with `qqdiff.` (reply texts name them, so they must be
the same on both brokers); each session deletes its names before and after it runs.

Header field types: pika sends str as S, bytes as x, bool as t, int as I or l, Decimal as D,
datetime as T, dict as F, list as A and None as V. It cannot send floats nor the short integer
types, so this script teaches pika's encoder one more value, `Field(tag, value)`, which sends
exactly that AMQP type (RabbitMQ's table types: t b B s u I i l f d D S x A T F V).
"""

import argparse
import ast
import datetime
import decimal
import fnmatch
import hashlib
import json
import re
import shlex
import struct
import subprocess
import sys
import time
import urllib.parse

import pika
import pika.data
import pika.exceptions
import pika.spec

from common import Deadline, deadline, parameters
from rawwire import (PROTOCOL_HEADER, RawConnection, amqplain, describe,
                     method_payload, raw_frame)

QUORUM = {'x-queue-type': 'quorum'}
WAIT = 10.0                    # how long a step waits for an expected delivery
STEP_DEADLINE = 30.0           # a step that takes longer is recorded as a timeout
PREFIX = 'qqdiff.'
NOCONF_USER = 'qqdiff-noconf'
NOVHOST_USER = 'qqdiff-novhost'
BODY_INLINE_MAX = 256          # longer bodies are recorded as length + sha256


# --- Wire types: sending any AMQP field type, reading back the type of every field ---------------

class Field:
    """A header or argument value sent with an explicit AMQP field type tag."""

    FORMATS = {'b': '>b', 'B': '>B', 's': '>h', 'u': '>H', 'I': '>i', 'i': '>I', 'l': '>q',
               'f': '>f', 'd': '>d', 'T': '>Q'}

    def __init__(self, tag, value):
        self.tag, self.value = tag, value

    def encode(self):
        return self.tag.encode() + struct.pack(self.FORMATS[self.tag], self.value)


def install_pika_extensions():
    """Teaches pika's encoder Field values and keeps the raw bytes of received properties."""
    original_encode = pika.data.encode_value
    if getattr(original_encode, 'qqdiff', False):
        return

    def encode_value(pieces, value):
        if isinstance(value, Field):
            encoded = value.encode()
            pieces.append(encoded)
            return len(encoded)
        return original_encode(pieces, value)

    encode_value.qqdiff = True
    pika.data.encode_value = encode_value

    class RawBasicProperties(pika.spec.BasicProperties):
        """BasicProperties that also keep the encoded property list (flags and fields)."""

        def decode(self, encoded, offset=0):
            self.raw = bytes(encoded[offset:])  # pylint: disable=attribute-defined-outside-init
            return super().decode(encoded, offset)

    pika.spec.props[pika.spec.BasicProperties.INDEX] = RawBasicProperties


class WireReader:
    """Decodes AMQP 0-9-1 values (RabbitMQ's field types) keeping each field's type tag.

    A field is recorded as [tag, value]: tables as {name: field}, arrays as [field, ...],
    byte arrays and non-UTF-8 strings as {"hex": ...}, decimals as [scale, unscaled value]."""

    FIXED = {'t': ('>B', 1), 'b': ('>b', 1), 'B': ('>B', 1), 's': ('>h', 2), 'U': ('>h', 2),
             'u': ('>H', 2), 'I': ('>i', 4), 'i': ('>I', 4), 'l': ('>q', 8), 'L': ('>q', 8),
             'f': ('>f', 4), 'd': ('>d', 8), 'T': ('>Q', 8)}

    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, count):
        piece = self.data[self.at:self.at + count]
        if len(piece) != count:
            raise ValueError('truncated properties')
        self.at += count
        return piece

    def unpack(self, fmt, size):
        return struct.unpack(fmt, self.take(size))[0]

    def shortstr(self):
        return text(self.take(self.unpack('>B', 1)))

    def table(self):
        end = self.unpack('>I', 4) + self.at
        fields = {}
        while self.at < end:
            name = self.shortstr()
            fields[name if isinstance(name, str) else json.dumps(name)] = self.field()
        return fields

    def field(self):
        tag = self.take(1).decode('latin-1')
        if tag in self.FIXED:
            value = self.unpack(*self.FIXED[tag])
            return [tag, bool(value) if tag == 't' else value]
        if tag == 'D':
            scale = self.unpack('>B', 1)
            return [tag, [scale, self.unpack('>i', 4)]]
        if tag == 'S':
            return [tag, text(self.take(self.unpack('>I', 4)))]
        if tag == 'x':
            return [tag, {'hex': self.take(self.unpack('>I', 4)).hex()}]
        if tag == 'A':
            end = self.unpack('>I', 4) + self.at
            items = []
            while self.at < end:
                items.append(self.field())
            return [tag, items]
        if tag == 'F':
            return [tag, self.table()]
        if tag == 'V':
            return [tag, None]
        raise ValueError(f'unknown field type {tag!r}')

    BASIC_PROPERTIES = [  # (name, kind) in flag order, bit 15 first
        ('content-type', 'shortstr'), ('content-encoding', 'shortstr'), ('headers', 'table'),
        ('delivery-mode', 'octet'), ('priority', 'octet'), ('correlation-id', 'shortstr'),
        ('reply-to', 'shortstr'), ('expiration', 'shortstr'), ('message-id', 'shortstr'),
        ('timestamp', 'timestamp'), ('type', 'shortstr'), ('user-id', 'shortstr'),
        ('app-id', 'shortstr'), ('cluster-id', 'shortstr')]

    def basic_properties(self):
        flags = []
        while True:
            word = self.unpack('>H', 2)
            flags.extend(bool(word & (1 << bit)) for bit in range(15, 0, -1))
            if not word & 1:
                break
        present = {}
        for (name, kind), flag in zip(self.BASIC_PROPERTIES, flags):
            if not flag:
                continue
            if kind == 'shortstr':
                present[name] = self.shortstr()
            elif kind == 'table':
                present[name] = self.table()
            elif kind == 'octet':
                present[name] = self.unpack('>B', 1)
            else:
                present[name] = self.unpack('>Q', 8)
        return present


def text(raw):
    try:
        return raw.decode('utf-8')
    except UnicodeDecodeError:
        return {'hex': raw.hex()}


# --- What a step observed, as JSON --------------------------------------------------------------------

def normalise_headers(headers):
    """x-death `time` differs between runs: replaced by "<time>" (its type tag is kept)."""
    deaths = headers.get('x-death')
    if deaths and deaths[0] == 'A':
        for death in deaths[1]:
            if death[0] == 'F' and 'time' in death[1]:
                death[1]['time'] = [death[1]['time'][0], '<time>']
    return headers


def properties_json(properties):
    raw = getattr(properties, 'raw', None)
    if raw is None:  # not decoded from the wire (cannot happen for received messages)
        return {'untyped': {k: repr(v) for k, v in vars(properties).items() if v is not None}}
    present = WireReader(raw).basic_properties()
    if 'headers' in present:
        present['headers'] = normalise_headers(present['headers'])
    return present


def body_json(body):
    if len(body) <= BODY_INLINE_MAX:
        return text(body)
    return {'length': len(body), 'sha256': hashlib.sha256(body).hexdigest()}


def method_json(method):
    fields = {name: value for name, value in vars(method).items() if not name.startswith('_')}
    return {'method': method.NAME, **({'fields': fields} if fields else {})}


def message_json(method, properties, body):
    return {**method_json(method), 'properties': properties_json(properties),
            'body': body_json(body)}


def result_json(result):
    """A step's return value as JSON."""
    if result is None:
        return {'reply': None}
    if isinstance(result, pika.frame.Method):
        return method_json(result.method)
    if isinstance(result, pika.amqp_object.Method):
        return method_json(result)
    if isinstance(result, tuple) and len(result) == 3:  # basic_get
        method, properties, body = result
        if method is None:
            return {'method': 'Basic.GetEmpty'}
        return message_json(method, properties, body)
    return {'result': result}


CLOSE_TEXT = re.compile(r'\((\d+)\)\s*(.*)$', re.S)


def close_of(error):
    """(code, text) of a broker close carried by a pika exception, or None."""
    if isinstance(error, (pika.exceptions.ChannelClosedByBroker,
                          pika.exceptions.ConnectionClosedByBroker)):
        return error.reply_code, error.reply_text
    # Connection set-up failures (ProbableAccessDeniedError, ...) carry the close as text:
    # 'ConnectionClosedByBroker: (530) "NOT_ALLOWED - ..."'.
    for arg in getattr(error, 'args', ()):
        if isinstance(arg, pika.exceptions.ConnectionClosedByBroker):
            return arg.reply_code, arg.reply_text
        match = CLOSE_TEXT.search(str(arg)) if 'ClosedByBroker' in str(arg) else None
        if match:
            try:
                reply_text = ast.literal_eval(match.group(2))  # pika shows it as repr(str)
            except (ValueError, SyntaxError):
                reply_text = match.group(2)
            return int(match.group(1)), reply_text
    return None


def error_json(error):
    if isinstance(error, pika.exceptions.ChannelClosedByBroker):
        return {'channel-close': {'code': error.reply_code, 'text': error.reply_text}}
    if isinstance(error, pika.exceptions.UnroutableError):
        return {'returned': [message_json(m.method, m.properties, m.body)
                             for m in error.messages]}
    if isinstance(error, pika.exceptions.NackError):
        return {'nacked': True}  # basic.nack for this publish (confirm mode)
    close = close_of(error)
    if close is not None:
        return {'connection-close': {'code': close[0], 'text': close[1]}}
    return {'error': f'{type(error).__name__}: {error!r}'}


# --- Sessions --------------------------------------------------------------------------------------

class StepTimeout(Exception):
    """A step waited WAIT seconds for something that did not come."""


def url_with_user(url, user, password, vhost=None):
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname + (f':{parts.port}' if parts.port else '')
    userinfo = f'{urllib.parse.quote(user, safe="")}:{urllib.parse.quote(password, safe="")}'
    path = parts.path if vhost is None else '/' + urllib.parse.quote(vhost, safe='')
    return urllib.parse.urlunsplit((parts.scheme, f'{userinfo}@{host}', path, parts.query, ''))


class Session:
    """One scripted session: a connection and a channel, reopened after a broker closes them,
    and the list of recorded steps."""

    def __init__(self, url):
        self.url = url
        self.connection = None
        self.channel_ = None
        self.confirms = False
        self.steps = []
        self.deliveries = {}  # consumer tag -> message_json of each delivery

    @property
    def channel(self):
        if self.connection is None or not self.connection.is_open:
            self.connection = pika.BlockingConnection(parameters(self.url))
            self.channel_ = None
        if self.channel_ is None or not self.channel_.is_open:
            self.channel_ = self.connection.channel()
            if self.confirms:
                self.channel_.confirm_delivery()
        return self.channel_

    def confirm(self):
        """Puts this and every later channel of the session in confirm mode."""
        self.confirms = True
        self.channel.confirm_delivery()

    def step(self, label, action, channel=True):
        """Runs action(channel) and records what it returned or what the broker answered.
        With channel=False the action gets None (it makes its own connection)."""
        try:
            with deadline(STEP_DEADLINE, label):
                entry = result_json(action(self.channel if channel else None))
        except StepTimeout as error:
            entry = {'error': f'timeout: {error}'}
        except Deadline as error:
            entry = {'error': f'timeout: {error}'}
            self.abandon()  # in an unknown state: start afresh
        except (pika.exceptions.AMQPError, OSError) as error:
            entry = error_json(error)
            if isinstance(error, pika.exceptions.ChannelClosedByBroker):
                self.channel_ = None
            elif self.connection is not None and not self.connection.is_open:
                self.connection = None
        except Exception as error:  # pylint: disable=broad-except
            # An answer pika or this script did not expect: recorded, and the session goes on.
            entry = {'error': f'{type(error).__name__}: {error}'}
            self.abandon()
        self.steps.append({'step': label, **entry})
        return entry

    def abandon(self):
        connection, self.connection, self.channel_ = self.connection, None, None
        if connection is not None:
            try:
                with deadline(5, 'abandoning a connection'):
                    connection.close()
            except (Deadline, pika.exceptions.AMQPError, OSError):
                pass

    def consume(self, queue, tag, count, **flags):
        """An action: starts a consumer that keeps what it receives (no ack) and waits for
        its first `count` deliveries; returns them."""
        def action(channel):
            got = self.deliveries.setdefault(tag, [])
            channel.basic_consume(
                queue=queue, consumer_tag=tag, **flags,
                on_message_callback=lambda _ch, m, p, b: got.append(message_json(m, p, b)))
            return self.wait_deliveries(tag, count)(channel)
        return action

    def wait_deliveries(self, tag, count):
        """An action: waits until the consumer `tag` has `count` more deliveries; returns them
        (and, after a short pause, any more that came)."""
        def action(channel):
            got = self.deliveries.setdefault(tag, [])
            start = len(got)
            deadline = time.monotonic() + WAIT
            while len(got) < start + count:
                if time.monotonic() > deadline:
                    raise StepTimeout(f'{len(got) - start} of {count} deliveries to {tag}')
                channel.connection.process_data_events(time_limit=0.1)
            channel.connection.process_data_events(time_limit=0.3)
            return got[start:]
        return action

    def close(self):
        self.abandon()


def delete_names(url, queues=(), exchanges=()):
    """Best effort, not recorded: deletes queues and exchanges left by a previous run."""
    try:
        with deadline(STEP_DEADLINE, 'deleting names'):
            delete_all(url, queues, exchanges)
    except (Deadline, pika.exceptions.AMQPError, OSError):
        pass


def delete_all(url, queues, exchanges):
    connection = None
    try:
        for kind, name in [('queue', q) for q in queues] + [('exchange', x) for x in exchanges]:
            if connection is None or not connection.is_open:
                connection = pika.BlockingConnection(parameters(url))
            try:
                if kind == 'queue':
                    connection.channel().queue_delete(queue=name)
                else:
                    connection.channel().exchange_delete(exchange=name)
            except pika.exceptions.AMQPError:
                pass
    finally:
        if connection is not None and connection.is_open:
            connection.close()


def quorum(channel, queue, arguments=None, **flags):
    flags.setdefault('durable', True)
    return channel.queue_declare(queue=queue, arguments={**QUORUM, **(arguments or {})}, **flags)


def get_when_there(queue, timeout=WAIT, auto_ack=True):
    """An action: basic.get until a message comes (dead letters arrive asynchronously)."""
    def action(channel):
        deadline = time.monotonic() + timeout
        while True:
            method, properties, body = channel.basic_get(queue=queue, auto_ack=auto_ack)
            if method is not None:
                return method, properties, body
            if time.monotonic() > deadline:
                raise StepTimeout(f'nothing in {queue} after {timeout}s')
            channel.connection.sleep(0.05)
    return action


def consume_messages(queue, count, tag, ack=True, **consume_flags):
    """An action: consumes count messages with consumer tag `tag`, then cancels; returns them."""
    def action(channel):
        got = []

        def on_message(ch, method, properties, body):
            got.append(message_json(method, properties, body))
            if ack and not consume_flags.get('auto_ack'):
                ch.basic_ack(delivery_tag=method.delivery_tag)

        channel.basic_consume(queue=queue, on_message_callback=on_message, consumer_tag=tag,
                              **consume_flags)
        deadline = time.monotonic() + WAIT
        while len(got) < count:
            if time.monotonic() > deadline:
                raise StepTimeout(f'{len(got)} of {count} deliveries from {queue}')
            channel.connection.process_data_events(time_limit=0.1)
        channel.basic_cancel(consumer_tag=tag)
        return got
    return action


def publish(exchange, routing_key, body=b'body', mandatory=False, **properties):
    def action(channel):
        channel.basic_publish(exchange=exchange, routing_key=routing_key, body=body,
                              properties=pika.BasicProperties(**properties),
                              mandatory=mandatory)
        return 'published'
    return action


def sync(channel):
    """A harmless round trip that surfaces an asynchronous channel close (basic.qos 0)."""
    return channel.basic_qos(prefetch_count=0)


def depth(queue, quiet=1.0):
    """An action: passive declare, repeated until its counts stayed the same for `quiet` seconds
    (at most WAIT): requeues after a channel closes and dead letters are asynchronous."""
    def action(channel):
        deadline_at = time.monotonic() + WAIT
        reply = channel.queue_declare(queue=queue, passive=True)
        stable_since = time.monotonic()
        while time.monotonic() - stable_since < quiet and time.monotonic() < deadline_at:
            channel.connection.sleep(0.1)
            again = channel.queue_declare(queue=queue, passive=True)
            counts = (again.method.message_count, again.method.consumer_count)
            if counts != (reply.method.message_count, reply.method.consumer_count):
                stable_since = time.monotonic()
            reply = again
        return reply
    return action


def session_server_properties(s):
    def action(channel):
        impl = channel.connection._impl  # pylint: disable=protected-access
        props = dict(impl.server_properties)
        capabilities = props.pop('capabilities', {})
        return {'properties': {k: v.decode() if isinstance(v, bytes) else v
                               for k, v in props.items()},
                'capabilities': capabilities,
                'negotiated': {'channel_max': impl.params.channel_max,
                               'frame_max': impl.params.frame_max,
                               'heartbeat': impl.params.heartbeat}}
    s.step('connection.start server properties and tune', action)


QUEUE_ARGUMENTS = {
    'x-max-length': {'x-max-length': 10},
    'x-max-length-bytes': {'x-max-length-bytes': 1000},
    'x-message-ttl': {'x-message-ttl': 60000},
    'x-dead-letter': {'x-dead-letter-exchange': PREFIX + 'nowhere',
                      'x-dead-letter-routing-key': 'dead'},
    'x-delivery-limit': {'x-delivery-limit': 5},
    'x-overflow-drop-head': {'x-overflow': 'drop-head'},
    'x-overflow-reject-publish': {'x-overflow': 'reject-publish'},
    'x-overflow-reject-publish-dlx': {'x-overflow': 'reject-publish-dlx'},
    'x-single-active-consumer': {'x-single-active-consumer': True},
    'x-expires': {'x-expires': 600000},
    'all-together': {'x-max-length': 10, 'x-max-length-bytes': 100000, 'x-message-ttl': 60000,
                     'x-dead-letter-exchange': '', 'x-dead-letter-routing-key': 'dead',
                     'x-delivery-limit': 5, 'x-overflow': 'reject-publish'},
    'long-long x-max-length': {'x-max-length': Field('l', 10)},
    'short x-max-length': {'x-max-length': Field('s', 10)},
}
BAD_QUEUE_ARGUMENTS = {
    'negative x-max-length': {'x-max-length': -1},
    'x-max-length as string': {'x-max-length': 'ten'},
    'x-message-ttl as string': {'x-message-ttl': '1000'},
    'negative x-message-ttl': {'x-message-ttl': -5},
    'unknown x-overflow': {'x-overflow': 'bogus'},
    'x-dead-letter-routing-key without exchange': {'x-dead-letter-routing-key': 'dead'},
    'negative x-delivery-limit': {'x-delivery-limit': -1},
    'x-expires 0': {'x-expires': 0},
    'x-max-priority (classic only)': {'x-max-priority': 10},
    'x-queue-mode lazy (classic only)': {'x-queue-mode': 'lazy'},
    'unknown x-queue-type': {'x-queue-type': 'bogus'},
    'x-queue-type stream': {'x-queue-type': 'stream'},
}


def queue_names_of_arguments():
    return [PREFIX + 'args.' + name.replace(' ', '-') for name in
            [*QUEUE_ARGUMENTS, *BAD_QUEUE_ARGUMENTS]]


def session_queue_declare_arguments(s):
    for name, arguments in QUEUE_ARGUMENTS.items():
        queue = PREFIX + 'args.' + name.replace(' ', '-')
        s.step(f'declare with {name}', lambda ch, q=queue, a=arguments: quorum(ch, q, a))
        s.step(f'redeclare with {name}', lambda ch, q=queue, a=arguments: quorum(ch, q, a))
        s.step(f'passive declare of {name}',
               lambda ch, q=queue: ch.queue_declare(queue=q, passive=True))
    for name, arguments in BAD_QUEUE_ARGUMENTS.items():
        queue = PREFIX + 'args.' + name.replace(' ', '-')
        s.step(f'declare with {name}', lambda ch, q=queue, a=arguments: quorum(ch, q, a))


def session_queue_redeclare_inequivalent(s):
    queue = PREFIX + 'ineq'
    base = {'x-max-length': 10, 'x-message-ttl': 1000}
    s.step('declare', lambda ch: quorum(ch, queue, base))
    s.step('redeclare x-max-length 11', lambda ch: quorum(ch, queue, {**base, 'x-max-length': 11}))
    s.step('redeclare without x-max-length',
           lambda ch: quorum(ch, queue, {'x-message-ttl': 1000}))
    s.step('redeclare with an extra x-delivery-limit',
           lambda ch: quorum(ch, queue, {**base, 'x-delivery-limit': 3}))
    s.step('redeclare x-message-ttl as a string',
           lambda ch: quorum(ch, queue, {**base, 'x-message-ttl': '1000'}))
    s.step('redeclare x-max-length as long-long',
           lambda ch: quorum(ch, queue, {**base, 'x-max-length': Field('l', 10)}))
    s.step('redeclare x-queue-type classic',
           lambda ch: ch.queue_declare(queue=queue, durable=True,
                                       arguments={**base, 'x-queue-type': 'classic'}))
    s.step('redeclare without x-queue-type',
           lambda ch: ch.queue_declare(queue=queue, durable=True, arguments=base))
    s.step('redeclare without any argument',
           lambda ch: ch.queue_declare(queue=queue, durable=True))
    s.step('redeclare non-durable', lambda ch: quorum(ch, queue, base, durable=False))
    s.step('redeclare exclusive', lambda ch: quorum(ch, queue, base, exclusive=True))
    s.step('redeclare auto-delete', lambda ch: quorum(ch, queue, base, auto_delete=True))
    s.step('passive declare with other arguments',
           lambda ch: ch.queue_declare(queue=queue, passive=True, arguments={'x-max-length': 99}))
    s.step('redeclare equivalent', lambda ch: quorum(ch, queue, base))

    exchange = PREFIX + 'ineq.x'
    s.step('exchange declare direct',
           lambda ch: ch.exchange_declare(exchange=exchange, exchange_type='direct', durable=True))
    s.step('exchange redeclare fanout',
           lambda ch: ch.exchange_declare(exchange=exchange, exchange_type='fanout', durable=True))
    s.step('exchange redeclare non-durable',
           lambda ch: ch.exchange_declare(exchange=exchange, exchange_type='direct'))
    s.step('exchange redeclare auto-delete',
           lambda ch: ch.exchange_declare(exchange=exchange, exchange_type='direct',
                                          durable=True, auto_delete=True))
    s.step('exchange redeclare internal',
           lambda ch: ch.exchange_declare(exchange=exchange, exchange_type='direct',
                                          durable=True, internal=True))
    s.step('exchange redeclare with an argument',
           lambda ch: ch.exchange_declare(exchange=exchange, exchange_type='direct', durable=True,
                                          arguments={'alternate-exchange': 'elsewhere'}))
    s.step('exchange redeclare equivalent',
           lambda ch: ch.exchange_declare(exchange=exchange, exchange_type='direct', durable=True))
    s.step('exchange passive declare of another type',
           lambda ch: ch.exchange_declare(exchange=exchange, exchange_type='topic', passive=True))


def session_quorum_refusals(s):
    q = PREFIX + 'refused'
    s.step('declare exclusive', lambda ch: quorum(ch, q + '.exclusive', exclusive=True))
    s.step('declare auto-delete', lambda ch: quorum(ch, q + '.auto-delete', auto_delete=True))
    s.step('declare non-durable', lambda ch: quorum(ch, q + '.non-durable', durable=False))
    s.step('declare exclusive, auto-delete and non-durable',
           lambda ch: quorum(ch, q + '.all', durable=False, exclusive=True, auto_delete=True))
    s.step('declare server-named', lambda ch: quorum(ch, ''))
    s.step('declare amq.-prefixed name', lambda ch: quorum(ch, 'amq.qqdiff'))
    s.step('passive declare of a refused one',
           lambda ch: ch.queue_declare(queue=q + '.exclusive', passive=True))


def session_missing_entities(s):
    queue, exchange = PREFIX + 'present', PREFIX + 'present.x'
    missing_queue, missing_exchange = PREFIX + 'missing', PREFIX + 'missing.x'
    s.step('declare a queue', lambda ch: quorum(ch, queue))
    s.step('declare an exchange',
           lambda ch: ch.exchange_declare(exchange=exchange, exchange_type='direct'))
    s.step('passive declare of a missing queue',
           lambda ch: ch.queue_declare(queue=missing_queue, passive=True))
    s.step('passive declare of a missing exchange',
           lambda ch: ch.exchange_declare(exchange=missing_exchange, passive=True))
    s.step('publish to a missing exchange', publish(missing_exchange, 'k'))
    s.step('round trip after it (basic.qos)', sync)
    s.step('bind to a missing exchange',
           lambda ch: ch.queue_bind(queue=queue, exchange=missing_exchange, routing_key='k'))
    s.step('bind a missing queue',
           lambda ch: ch.queue_bind(queue=missing_queue, exchange=exchange, routing_key='k'))
    s.step('unbind a binding that does not exist',
           lambda ch: ch.queue_unbind(queue=queue, exchange=exchange, routing_key='nope'))
    s.step('consume from a missing queue',
           lambda ch: ch.basic_consume(queue=missing_queue, on_message_callback=print,
                                       consumer_tag='qqdiff-missing'))
    s.step('get from a missing queue', lambda ch: ch.basic_get(queue=missing_queue))
    s.step('purge a missing queue', lambda ch: ch.queue_purge(queue=missing_queue))
    s.step('delete a missing queue', lambda ch: ch.queue_delete(queue=missing_queue))
    s.step('delete a missing exchange', lambda ch: ch.exchange_delete(exchange=missing_exchange))
    s.step('confirm mode', lambda ch: s.confirm())
    s.step('publish to a missing exchange, confirm mode', publish(missing_exchange, 'k'))
    s.step('publish to the default exchange, no such queue, confirm mode',
           publish('', missing_queue))
    s.step('mandatory publish to the default exchange, no such queue',
           publish('', missing_queue, mandatory=True))


def every_header_type():
    return {
        'str': 'text é', 'bytes': b'\x00\xffraw', 'true': True, 'false': False,
        'int-small': 7, 'int-negative': -70000, 'int-64': 2 ** 40, 'int-64-negative': -2 ** 40,
        'int-max': 2 ** 63 - 1, 'decimal': decimal.Decimal('3.14'),
        'decimal-negative': decimal.Decimal('-0.005'),
        'timestamp': datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
        'table': {'a': 1, 'nested': {'deeper': 'yes', 'list': [1, 'two']}},
        'array': [1, 'a', [2, b'\x01'], {'k': None}], 'empty-array': [], 'empty-table': {},
        'void': None, 'empty-str': '',
        'short-short': Field('b', -8), 'short-short-unsigned': Field('B', 200),
        'short': Field('s', -300), 'short-unsigned': Field('u', 60000),
        'long-unsigned': Field('i', 4000000000), 'long-long': Field('l', 5),
        'float': Field('f', 1.5), 'double': Field('d', -2.25),
        'timestamp-raw': Field('T', 1700000000),
    }


def all_properties(headers):
    return {'content_type': 'application/json', 'content_encoding': 'gzip', 'headers': headers,
            'delivery_mode': 2, 'priority': 3, 'correlation_id': 'corr-1', 'reply_to': 'replies',
            'expiration': '600000', 'message_id': 'msg-1', 'timestamp': 1700000000,
            'type': 'order.created', 'user_id': None, 'app_id': 'qqdiff', 'cluster_id': 'c1'}


def session_properties_roundtrip(s, user):
    queue = PREFIX + 'props'
    props = {**all_properties(every_header_type()), 'user_id': user}
    s.step('declare', lambda ch: quorum(ch, queue))
    s.step('confirm mode', lambda ch: s.confirm())
    s.step('publish with all 14 properties', publish('', queue, b'{"n": 1}', **props))
    s.step('basic.get it', lambda ch: ch.basic_get(queue=queue, auto_ack=True))
    s.step('publish it again', publish('', queue, b'{"n": 2}', **props))
    s.step('consume it', consume_messages(queue, 1, 'qqdiff-props'))
    s.step('publish with no properties', publish('', queue, b''))
    s.step('basic.get it', lambda ch: ch.basic_get(queue=queue, auto_ack=True))
    s.step('publish delivery-mode 1 and empty strings',
           publish('', queue, b'x', delivery_mode=1, content_type='', message_id='',
                   headers={}))
    s.step('basic.get it', lambda ch: ch.basic_get(queue=queue, auto_ack=True))
    big = bytes(range(256)) * 2048  # 512 KiB: split over many frames
    s.step('publish a 512 KiB body', publish('', queue, big))
    s.step('basic.get it', lambda ch: ch.basic_get(queue=queue, auto_ack=True))
    s.step('publish headers that look like x-death', publish(
        '', queue, b'forged', headers={'x-death': [{'count': 5, 'reason': 'rejected'}],
                                       'x-first-death-reason': 'expired',
                                       'x-delivery-count': 7}))
    s.step('basic.get it', lambda ch: ch.basic_get(queue=queue, auto_ack=True))


def session_user_id(s, user):
    queue = PREFIX + 'user-id'
    s.step('declare', lambda ch: quorum(ch, queue))
    s.step('publish with the authenticated user-id', publish('', queue, user_id=user))
    s.step('round trip', sync)
    s.step('basic.get it', lambda ch: ch.basic_get(queue=queue, auto_ack=True))
    s.step('publish with another user-id', publish('', queue, user_id='someone-else'))
    s.step('round trip', sync)
    s.step('confirm mode', lambda ch: s.confirm())
    s.step('publish with another user-id, confirm mode',
           publish('', queue, user_id='someone-else'))


def dead_letter_setup(s, source, arguments):
    """entry (direct, key 'work') -> source --dead letters--> DLX (fanout) -> dlq."""
    dlx, dlq, entry = PREFIX + 'dlx', PREFIX + 'dlq', PREFIX + 'entry'
    s.step('declare the DLX',
           lambda ch: ch.exchange_declare(exchange=dlx, exchange_type='fanout', durable=True))
    s.step('declare the dead-letter queue', lambda ch: quorum(ch, dlq))
    s.step('bind it', lambda ch: ch.queue_bind(queue=dlq, exchange=dlx))
    s.step('declare the entry exchange',
           lambda ch: ch.exchange_declare(exchange=entry, exchange_type='direct', durable=True))
    s.step('declare the source queue',
           lambda ch: quorum(ch, source, {'x-dead-letter-exchange': dlx, **arguments}))
    s.step('bind it', lambda ch: ch.queue_bind(queue=source, exchange=entry, routing_key='work'))
    s.step('confirm mode', lambda ch: s.confirm())
    return entry, dlq


DEAD_LETTER_NAMES = {'queues': [PREFIX + 'dlq'], 'exchanges': [PREFIX + 'dlx', PREFIX + 'entry']}


def session_dead_letter_rejected(s):
    source = PREFIX + 'rejecting'
    entry, dlq = dead_letter_setup(s, source, {'x-dead-letter-routing-key': 'dead'})
    cc = {'headers': {'CC': ['cc-key'], 'app': 'kept'}, 'message_id': 'rej-1',
          'expiration': '600000'}
    s.step('publish with CC and expiration', publish(entry, 'work', b'reject me', **cc))
    s.step('basic.get', lambda ch: ch.basic_get(queue=source))
    s.step('basic.reject requeue=false', lambda ch: ch.basic_reject(delivery_tag=1, requeue=False))
    s.step('the dead letter', get_when_there(dlq))
    s.step('publish another', publish(entry, 'work', b'nack me', message_id='rej-2'))
    s.step('consume it without ack', s.consume(source, 'qqdiff-dl', 1))
    s.step('basic.nack requeue=false', lambda ch: ch.basic_nack(delivery_tag=3, requeue=False))
    s.step('cancel', lambda ch: ch.basic_cancel(consumer_tag='qqdiff-dl'))
    s.step('the dead letter', get_when_there(dlq, auto_ack=False))

    # The dead letter, republished by a client with its death headers, dies again.
    def republish(ch):
        method, properties, body = get_when_there(dlq)(ch)
        ch.basic_publish(exchange=entry, routing_key='work', body=body, properties=properties)
        return 'republished'

    s.step('basic.recover (requeue the unacked dead letter)',
           lambda ch: ch.basic_recover(requeue=True))
    s.step('republish the dead letter with its headers', republish)
    s.step('basic.get', get_when_there(source, auto_ack=False))

    def reject_last(ch):
        method, _properties, _body = get_when_there(source, auto_ack=False)(ch)
        ch.basic_reject(delivery_tag=method.delivery_tag, requeue=False)
        return 'rejected'

    s.step('basic.recover, get and reject it again',
           lambda ch: (ch.basic_recover(requeue=True), reject_last(ch))[1])
    s.step('the twice-dead letter', get_when_there(dlq))

    source_keys = PREFIX + 'rejecting.keys'
    s.step('declare a source without dead-letter routing key',
           lambda ch: quorum(ch, source_keys, {'x-dead-letter-exchange': PREFIX + 'dlx'}))
    s.step('bind it', lambda ch: ch.queue_bind(queue=source_keys, exchange=entry,
                                               routing_key='keys'))
    s.step('publish with CC and BCC',
           publish(entry, 'keys', b'keys', headers={'CC': ['cc-1', 'cc-2'], 'BCC': ['bcc-1']}))
    s.step('basic.get, the CC is there, the BCC is not',
           lambda ch: ch.basic_get(queue=source_keys, auto_ack=False))

    def reject_all(ch):
        ch.basic_nack(delivery_tag=0, multiple=True, requeue=False)
        return 'nacked'

    s.step('basic.nack multiple requeue=false', reject_all)
    s.step('the dead letter keeps its keys', get_when_there(dlq))


def session_dead_letter_expired(s):
    source = PREFIX + 'expiring'
    entry, dlq = dead_letter_setup(s, source, {'x-message-ttl': 100})
    s.step('publish', publish(entry, 'work', b'expire me', message_id='ttl-1'))
    s.step('the dead letter (queue TTL)', get_when_there(dlq))
    s.step('publish with expiration 50', publish(entry, 'work', b'me too', expiration='50'))
    s.step('the dead letter (message TTL below queue TTL)', get_when_there(dlq))
    source_no_ttl = PREFIX + 'expiring.per-message'
    s.step('declare a source without TTL',
           lambda ch: quorum(ch, source_no_ttl, {'x-dead-letter-exchange': PREFIX + 'dlx'}))
    s.step('publish with expiration 100', publish('', source_no_ttl, b'm', expiration='100'))
    s.step('the dead letter (message TTL)', get_when_there(dlq))
    s.step('publish with expiration 0', publish('', source_no_ttl, b'zero', expiration='0'))
    s.step('the dead letter (expiration 0)', get_when_there(dlq))
    s.step('publish with expiration "abc"', publish('', source_no_ttl, b'bad', expiration='abc'))
    s.step('round trip', sync)
    s.step('publish with expiration "-1"', publish('', source_no_ttl, b'bad', expiration='-1'))
    s.step('round trip', sync)


def session_delivery_limit(s):
    source = PREFIX + 'limited'
    _entry, dlq = dead_letter_setup(s, source, {'x-delivery-limit': 1})
    s.step('publish', publish('', source, b'poison', message_id='limit-1'))
    s.step('basic.get', lambda ch: ch.basic_get(queue=source))
    s.step('basic.nack requeue=true', lambda ch: ch.basic_nack(delivery_tag=1, requeue=True))
    s.step('basic.get again', get_when_there(source, auto_ack=False))
    s.step('basic.nack requeue=true', lambda ch: ch.basic_nack(delivery_tag=2, requeue=True))
    s.step('the dead letter', get_when_there(dlq))
    s.step('the source is empty', depth(source))
    s.step('publish another', publish('', source, b'poison 2', message_id='limit-2'))
    s.step('consume, no ack', s.consume(source, 'qqdiff-limit', 1))
    s.step('basic.reject requeue=true', lambda ch: ch.basic_reject(delivery_tag=4, requeue=True))
    s.step('the redelivery', s.wait_deliveries('qqdiff-limit', 1))
    s.step('basic.reject requeue=true', lambda ch: ch.basic_reject(delivery_tag=5, requeue=True))
    s.step('no more deliveries', lambda ch: (ch.connection.process_data_events(time_limit=0.5),
                                             s.deliveries['qqdiff-limit'][2:])[1])
    s.step('cancel', lambda ch: ch.basic_cancel(consumer_tag='qqdiff-limit'))
    s.step('the dead letter', get_when_there(dlq))


def session_max_length(s):
    source = PREFIX + 'bounded'
    _entry, dlq = dead_letter_setup(s, source, {'x-max-length': 1})
    s.step('publish 1', publish('', source, b'first'))
    s.step('publish 2', publish('', source, b'second'))
    s.step('the dropped head, dead-lettered', get_when_there(dlq))
    s.step('depth', depth(source))
    rejecting = PREFIX + 'bounded.reject'
    s.step('declare reject-publish, max-length 1',
           lambda ch: quorum(ch, rejecting, {'x-max-length': 1, 'x-overflow': 'reject-publish',
                                             'x-dead-letter-exchange': PREFIX + 'dlx'}))
    for n in range(1, 4):
        s.step(f'publish {n}', publish('', rejecting, f'r{n}'.encode()))
    s.step('depth', depth(rejecting))
    s.step('mandatory publish to it', publish('', rejecting, b'r4', mandatory=True))
    rejecting_dlx = PREFIX + 'bounded.reject-dlx'
    s.step('declare reject-publish-dlx, max-length 1',
           lambda ch: quorum(ch, rejecting_dlx, {'x-max-length': 1,
                                                 'x-overflow': 'reject-publish-dlx',
                                                 'x-dead-letter-exchange': PREFIX + 'dlx'}))
    for n in range(1, 4):
        s.step(f'publish {n}', publish('', rejecting_dlx, f'd{n}'.encode()))
    s.step('depth', depth(rejecting_dlx))
    s.step('dead-letter queue depth', depth(dlq))


def session_permissions(s, url):
    queue = PREFIX + 'perm'
    s.step('guest declares a queue', lambda ch: quorum(ch, queue))

    def as_user(user, vhost=None, then=None):
        def action(_channel):
            target = url_with_user(url, user, user if user != 'guest' else 'wrong-password',
                                   vhost)
            connection = pika.BlockingConnection(parameters(target))
            try:
                channel = connection.channel()
                return then(channel) if then else 'opened'
            finally:
                if connection.is_open:
                    connection.close()
        return action

    s.step('no-configure user opens /', as_user(NOCONF_USER))
    s.step('no-configure user declares a queue',
           as_user(NOCONF_USER, then=lambda ch: quorum(ch, PREFIX + 'perm.new')))
    s.step('no-configure user passively declares an existing queue',
           as_user(NOCONF_USER, then=lambda ch: ch.queue_declare(queue=queue, passive=True)))
    s.step('no-configure user redeclares an existing queue',
           as_user(NOCONF_USER, then=lambda ch: quorum(ch, queue)))
    s.step('no-configure user declares an exchange',
           as_user(NOCONF_USER, then=lambda ch: ch.exchange_declare(
               exchange=PREFIX + 'perm.x', exchange_type='direct')))
    s.step('no-configure user deletes the queue',
           as_user(NOCONF_USER, then=lambda ch: ch.queue_delete(queue=queue)))
    s.step('no-configure user publishes and gets',
           as_user(NOCONF_USER, then=lambda ch: (
               ch.basic_publish(exchange='', routing_key=queue, body=b'p'),
               get_when_there(queue)(ch))[1]))
    s.step('user without permissions opens /', as_user(NOVHOST_USER))
    s.step('guest with a wrong password', as_user('guest'))
    s.step('unknown user', as_user('qqdiff-nobody'))
    s.step('guest opens a vhost that does not exist',
           lambda _ch: as_user_guest(url, 'qqdiff-no-such-vhost'))


def as_user_guest(url, vhost):
    parts = urllib.parse.urlsplit(url)
    target = url_with_user(url, urllib.parse.unquote(parts.username or 'guest'),
                           urllib.parse.unquote(parts.password or 'guest'), vhost)
    connection = pika.BlockingConnection(parameters(target))
    connection.close()
    return 'opened'


def session_qos(s):
    queue = PREFIX + 'qos'
    s.step('declare', lambda ch: quorum(ch, queue))
    s.step('basic.qos prefetch 10 per consumer', lambda ch: ch.basic_qos(prefetch_count=10))
    s.step('consume', lambda ch: ch.basic_consume(
        queue=queue, on_message_callback=lambda *_: None, consumer_tag='qqdiff-qos-1'))
    s.step('cancel', lambda ch: ch.basic_cancel(consumer_tag='qqdiff-qos-1'))
    s.step('basic.qos prefetch-size 1000', lambda ch: ch.basic_qos(prefetch_size=1000))
    s.step('basic.qos prefetch 10 global', lambda ch: ch.basic_qos(prefetch_count=10,
                                                                   global_qos=True))
    s.step('consume with global qos', lambda ch: ch.basic_consume(
        queue=queue, on_message_callback=lambda *_: None, consumer_tag='qqdiff-qos-2'))
    s.step('basic.qos prefetch 0 global', lambda ch: ch.basic_qos(prefetch_count=0,
                                                                  global_qos=True))
    s.step('consume after global qos 0', lambda ch: ch.basic_consume(
        queue=queue, on_message_callback=lambda *_: None, consumer_tag='qqdiff-qos-3'))
    s.step('basic.get with global qos', lambda ch: (
        ch.basic_qos(prefetch_count=10, global_qos=True), ch.basic_get(queue=queue))[1])


def session_delete_and_purge(s):
    queue = PREFIX + 'purge'
    s.step('declare', lambda ch: quorum(ch, queue))
    s.step('confirm mode', lambda ch: s.confirm())
    for n in range(3):
        s.step(f'publish {n}', publish('', queue, f'm{n}'.encode()))
    s.step('delete if-empty', lambda ch: ch.queue_delete(queue=queue, if_empty=True))
    s.step('consume without ack', s.consume(queue, 'qqdiff-purge', 3))
    s.step('delete if-unused', lambda ch: ch.queue_delete(queue=queue, if_unused=True))
    s.step('depth', depth(queue))
    s.step('purge', lambda ch: ch.queue_purge(queue=queue))
    s.step('purge again', lambda ch: ch.queue_purge(queue=queue))
    s.step('publish 2 more', lambda ch: [publish('', queue, b'x')(ch) for _ in range(2)])
    s.step('delete', lambda ch: ch.queue_delete(queue=queue))
    s.step('depth', depth(queue))


def session_returns(s):
    exchange = PREFIX + 'returns'
    s.step('declare an exchange without bindings',
           lambda ch: ch.exchange_declare(exchange=exchange, exchange_type='direct'))
    s.step('confirm mode', lambda ch: s.confirm())
    s.step('mandatory publish', publish(exchange, 'nowhere', b'back to me', mandatory=True,
                                        message_id='ret-1', headers={'h': 'v'}))
    s.step('publish without mandatory', publish(exchange, 'nowhere', b'dropped'))


def session_consumer_cancel(s, url):
    queue = PREFIX + 'cancel'
    s.step('declare', lambda ch: quorum(ch, queue))

    def consume_then_delete(channel):
        cancels = []
        channel.add_on_cancel_callback(cancels.append)
        channel.basic_consume(queue=queue, on_message_callback=lambda *_: None,
                              consumer_tag='qqdiff-cancelled')
        other = pika.BlockingConnection(parameters(url))
        other.channel().queue_delete(queue=queue)
        other.close()
        deadline = time.monotonic() + WAIT
        while not cancels:
            if time.monotonic() > deadline:
                raise StepTimeout('no basic.cancel')
            channel.connection.process_data_events(time_limit=0.1)
        return {**method_json(cancels[0].method), 'channel_open': channel.is_open}

    s.step('consume, another connection deletes the queue', consume_then_delete)
    s.step('channel still usable', sync)


def session_acks(s):
    queue = PREFIX + 'acks'
    s.step('declare', lambda ch: quorum(ch, queue))
    s.step('confirm mode', lambda ch: s.confirm())
    for n in range(4):
        s.step(f'publish {n}', publish('', queue, f'a{n}'.encode()))
    s.step('basic.get', lambda ch: ch.basic_get(queue=queue))
    s.step('ack an unknown delivery tag', lambda ch: ch.basic_ack(delivery_tag=99))
    s.step('round trip', sync)
    s.step('depth', depth(queue))
    s.step('get 2 (new channel)', lambda ch: [result_json(ch.basic_get(queue=queue))
                                              for _ in range(2)])
    s.step('ack tag 1', lambda ch: ch.basic_ack(delivery_tag=1))
    s.step('ack tag 1 again', lambda ch: ch.basic_ack(delivery_tag=1))
    s.step('round trip', sync)
    s.step('depth', depth(queue))
    s.step('get 3 (new channel)', lambda ch: [result_json(ch.basic_get(queue=queue))
                                              for _ in range(3)])
    s.step('nack multiple up to 2, requeue', lambda ch: ch.basic_nack(delivery_tag=2,
                                                                      multiple=True))
    s.step('ack tag 3', lambda ch: ch.basic_ack(delivery_tag=3))
    s.step('depth', depth(queue))
    s.step('get the rest', lambda ch: [result_json(ch.basic_get(queue=queue, auto_ack=True))
                                       for _ in range(4)])
    s.step('reject a tag already acked', lambda ch: ch.basic_reject(delivery_tag=3))
    s.step('round trip', sync)
    s.step('basic.recover requeue=false', lambda ch: ch.basic_recover(requeue=False))


def session_exchanges(s):
    x = PREFIX + 'x.'
    for kind in ('direct', 'fanout', 'topic', 'headers'):
        s.step(f'declare {kind}',
               lambda ch, k=kind: ch.exchange_declare(exchange=x + k, exchange_type=k))
    s.step('declare an unknown type',
           lambda ch: ch.exchange_declare(exchange=x + 'bogus', exchange_type='x-bogus'))
    s.step('declare amq.-prefixed',
           lambda ch: ch.exchange_declare(exchange='amq.qqdiff', exchange_type='direct'))
    s.step('redeclare amq.direct',
           lambda ch: ch.exchange_declare(exchange='amq.direct', exchange_type='direct',
                                          durable=True))
    s.step('passive declare amq.topic', lambda ch: ch.exchange_declare(exchange='amq.topic',
                                                                        passive=True))
    s.step('delete amq.direct', lambda ch: ch.exchange_delete(exchange='amq.direct'))
    s.step('delete the default exchange', lambda ch: ch.exchange_delete(exchange=''))
    s.step('declare internal',
           lambda ch: ch.exchange_declare(exchange=x + 'internal', exchange_type='fanout',
                                          internal=True))
    s.step('publish to the internal exchange', publish(x + 'internal', ''))
    s.step('round trip', sync)
    queue = PREFIX + 'x.q'
    s.step('declare a queue', lambda ch: quorum(ch, queue))
    s.step('bind to the default exchange',
           lambda ch: ch.queue_bind(queue=queue, exchange='', routing_key='k'))
    s.step('bind headers x-match all',
           lambda ch: ch.queue_bind(queue=queue, exchange=x + 'headers',
                                    arguments={'x-match': 'all', 'a': 1, 'b': 'two'}))
    s.step('exchange-to-exchange bind topic -> fanout',
           lambda ch: ch.exchange_bind(destination=x + 'fanout', source=x + 'topic',
                                       routing_key='#.audit'))
    s.step('bind the fanout', lambda ch: ch.queue_bind(queue=queue, exchange=x + 'fanout'))
    s.step('confirm mode', lambda ch: s.confirm())
    s.step('publish headers match', publish(x + 'headers', '', b'h1', headers={'a': 1, 'b': 'two',
                                                                            'c': 3}))
    s.step('publish headers partial', publish(x + 'headers', '', b'h2', headers={'a': 1}))
    s.step('publish via e2e binding', publish(x + 'topic', 'orders.audit', b'e2e'))
    s.step('publish via e2e, no match', publish(x + 'topic', 'orders.other', b'no'))
    s.step('depth', depth(queue))
    s.step('unbind e2e', lambda ch: ch.exchange_unbind(destination=x + 'fanout',
                                                       source=x + 'topic',
                                                       routing_key='#.audit'))
    s.step('delete bound exchange if-unused',
           lambda ch: ch.exchange_delete(exchange=x + 'fanout', if_unused=True))


def exchange_names():
    return [PREFIX + 'x.' + k for k in ('direct', 'fanout', 'topic', 'headers', 'bogus',
                                        'internal')]


def session_consumers(s, url):
    queue = PREFIX + 'consumers'
    s.step('declare', lambda ch: quorum(ch, queue))
    s.step('consume exclusive', lambda ch: ch.basic_consume(
        queue=queue, on_message_callback=lambda *_: None, consumer_tag='qqdiff-exclusive',
        exclusive=True))

    def other_connection_consumes(exclusive):
        def action(_channel):
            other = pika.BlockingConnection(parameters(url))
            try:
                return other.channel().basic_consume(
                    queue=queue, on_message_callback=lambda *_: None, exclusive=exclusive,
                    consumer_tag=f'qqdiff-other-exclusive-{exclusive}')
            finally:
                if other.is_open:
                    other.close()
        return action

    s.step('another connection consumes', other_connection_consumes(False))
    s.step('another connection consumes exclusive', other_connection_consumes(True))
    s.step('consume again on the same channel', lambda ch: ch.basic_consume(
        queue=queue, on_message_callback=lambda *_: None, consumer_tag='qqdiff-second'))
    s.step('consume with x-priority', lambda ch: ch.basic_consume(
        queue=queue, on_message_callback=lambda *_: None, consumer_tag='qqdiff-priority',
        arguments={'x-priority': 5}))
    s.step('consumer count', depth(queue))
    s.step('cancel an unknown tag', lambda ch: ch.basic_cancel(consumer_tag='qqdiff-nobody'))
    noack = PREFIX + 'consumers.noack'
    s.step('declare another queue', lambda ch: quorum(ch, noack))
    s.step('confirm mode', lambda ch: s.confirm())
    s.step('publish', publish('', noack, b'no ack'))
    s.step('consume no-ack', consume_messages(noack, 1, 'qqdiff-noack', auto_ack=True))
    s.step('depth', depth(noack))
    sac = PREFIX + 'consumers.sac'
    s.step('declare single-active-consumer',
           lambda ch: quorum(ch, sac, {'x-single-active-consumer': True}))
    s.step('two consumers, publish 2', lambda ch: single_active(ch, sac))
    s.step('basic.get on the single-active-consumer queue', lambda ch: ch.basic_get(queue=sac))


def single_active(channel, queue):
    got = {'qqdiff-sac-1': [], 'qqdiff-sac-2': []}
    for tag in got:
        channel.basic_consume(queue=queue, consumer_tag=tag,
                              on_message_callback=lambda ch, m, p, b: (
                                  got[m.consumer_tag].append(b.decode()),
                                  ch.basic_ack(delivery_tag=m.delivery_tag)))
    for n in range(2):
        channel.basic_publish(exchange='', routing_key=queue, body=f's{n}')
    deadline = time.monotonic() + WAIT
    while sum(map(len, got.values())) < 2:
        if time.monotonic() > deadline:
            raise StepTimeout(f'single active consumer got {got}')
        channel.connection.process_data_events(time_limit=0.1)
    return got


# --- Wire-level sessions (rawwire.py): what pika will not send -----------------------------------

def raw(url, script):
    """An action: script(raw connection) on a fresh socket; returns what it observed."""
    def action(_channel):
        connection = RawConnection(url)
        try:
            return script(connection)
        finally:
            connection.close()
    return action


def header_reply(data):
    def script(connection):
        connection.send(data)
        reply, deadline_at = b'', time.monotonic() + 5
        while time.monotonic() < deadline_at:
            chunk = connection.read_bytes(deadline_at - time.monotonic())
            if not chunk:
                return {'reply-hex': reply.hex(), 'socket-closed': chunk == b''}
            reply += chunk
        return {'reply-hex': reply.hex(), 'socket-closed': False}
    return script


def session_wire_handshake(s, url):
    s.step('AMQP 0-10 protocol header', raw(url, header_reply(b'AMQP\x01\x01\x00\x0a')),
           channel=False)
    s.step('AMQP 0-8 protocol header', raw(url, header_reply(b'AMQP\x01\x01\x08\x00')),
           channel=False)
    s.step('an HTTP request', raw(url, header_reply(b'GET / HTTP/1.1\r\nHost: x\r\n\r\n')),
           channel=False)

    def start(connection):
        connection.send(PROTOCOL_HEADER)
        return describe(connection.read_frame())

    s.step('connection.start', raw(url, start), channel=False)

    def login(mechanism, response=None, auth_failure_close=True):
        def script(connection):
            _start, answer = connection.handshake(
                mechanism, response(connection) if response else None, auth_failure_close)
            if (isinstance(answer, pika.frame.Method)
                    and isinstance(answer.method, pika.spec.Connection.Close)):
                connection.send_method(0, pika.spec.Connection.CloseOk())
            return [describe(answer), *connection.observe(timeout=1)]
        return script

    s.step('PLAIN login', raw(url, login('PLAIN')), channel=False)
    s.step('AMQPLAIN login', raw(url, login(
        'AMQPLAIN', lambda c: amqplain(c.user, c.password))), channel=False)
    s.step('AMQPLAIN wrong password', raw(url, login(
        'AMQPLAIN', lambda c: amqplain(c.user, c.password + '-wrong'))), channel=False)
    s.step('PLAIN wrong password', raw(url, login(
        'PLAIN', lambda c: f'\0{c.user}\0{c.password}-wrong'.encode())), channel=False)
    s.step('PLAIN wrong password, no authentication_failure_close capability', raw(url, login(
        'PLAIN', lambda c: f'\0{c.user}\0{c.password}-wrong'.encode(), False)), channel=False)
    s.step('unknown mechanism', raw(url, login('X-UNKNOWN')), channel=False)
    s.step('PLAIN with a malformed response', raw(url, login('PLAIN', lambda c: b'garbage')),
           channel=False)


def session_wire_bad_frames(s, url):
    def after_open(send):
        """A script: handshake, open channel 1, send(connection), observe the answer."""
        def script(connection):
            _start, opened = connection.handshake()
            if not (isinstance(opened, pika.frame.Method)
                    and isinstance(opened.method, pika.spec.Connection.OpenOk)):
                return ['handshake failed', describe(opened)]
            connection.open_channel(1)
            send(connection)
            return connection.observe(timeout=3)
        return script

    def publish_start(connection, body_size):
        connection.send_method(1, pika.spec.Basic.Publish(exchange='', routing_key='qqdiff.nowhere'))
        connection.send(pika.frame.Header(1, body_size, pika.spec.BasicProperties()).marshal())

    qos = pika.frame.Method(1, pika.spec.Basic.Qos(prefetch_count=1)).marshal()
    cases = {
        'unknown method id': lambda c: c.send(raw_frame(1, 1, method_payload(60, 999))),
        'unknown class id': lambda c: c.send(raw_frame(1, 1, method_payload(999, 10))),
        'method on an unopened channel': lambda c: c.send_method(
            5, pika.spec.Basic.Qos(prefetch_count=1)),
        'channel.open on an open channel': lambda c: c.send_method(1, pika.spec.Channel.Open()),
        'channel above channel-max': lambda c: c.send_method(60000, pika.spec.Channel.Open()),
        'connection method on channel 1': lambda c: c.send_method(
            1, pika.spec.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0)),
        'channel method on channel 0': lambda c: c.send_method(0, pika.spec.Channel.Flow()),
        'content header without a method': lambda c: c.send(
            pika.frame.Header(1, 4, pika.spec.BasicProperties()).marshal()),
        'content body without a method': lambda c: c.send(pika.frame.Body(1, b'abcd').marshal()),
        'a method before the body ends': lambda c: (publish_start(c, 10), c.send(qos)),
        'a body longer than declared': lambda c: (publish_start(c, 4),
                                                  c.send(pika.frame.Body(1, b'12345678').marshal())),
        'a frame larger than frame-max': lambda c: c.send(raw_frame(
            1, 1, method_payload(60, 10, b'\0' * (c.frame_max + 100)))),
        'a bad frame-end octet': lambda c: c.send(qos[:-1] + b'\x00'),
        'an unknown frame type': lambda c: c.send(raw_frame(9, 1, b'')),
        'a heartbeat on channel 1': lambda c: c.send(raw_frame(8, 1, b'')),
        'a truncated method': lambda c: c.send(raw_frame(1, 1, method_payload(60, 10, b'\0'))),
        'garbage after the handshake': lambda c: c.send(b'\xff' * 16),
    }
    for label, send in cases.items():
        s.step(label, raw(url, after_open(send)), channel=False)


def session_wire_heartbeat(s, url):
    """Heartbeat 1 s negotiated, then silence: when and how does the broker drop the peer?
    Heartbeat frames are counted, not recorded (their number depends on timing)."""
    def silent(connection):
        _start, opened = connection.handshake(heartbeat=1)
        if not (isinstance(opened, pika.frame.Method)
                and isinstance(opened.method, pika.spec.Connection.OpenOk)):
            return ['handshake failed', describe(opened)]
        started, seen, heartbeats = time.monotonic(), [], 0
        while time.monotonic() - started < 10:
            frame = connection.read_frame(timeout=10 - (time.monotonic() - started))
            if isinstance(frame, pika.frame.Heartbeat):
                heartbeats += 1
                continue
            seen.append(describe(frame) if frame is not None else 'nothing more')
            if frame is None or isinstance(frame, str):
                break
        after = time.monotonic() - started
        return {'frames': seen, 'sent heartbeats': heartbeats > 0,
                'dropped within 1.5-4.5 s (two to four missed intervals)': 1.5 <= after <= 4.5}
    s.step('negotiate heartbeat 1 s, then stay silent', raw(url, silent), channel=False)

    def chatty(connection):
        _start, opened = connection.handshake(heartbeat=1)
        started = time.monotonic()
        while time.monotonic() - started < 4:
            connection.send(raw_frame(8, 0, b''))
            frame = connection.read_frame(timeout=0.4)
            if isinstance(frame, str):
                return {'dropped': True, 'after-s': round(time.monotonic() - started)}
        return {'dropped': False}
    s.step('negotiate heartbeat 1 s, send heartbeats for 4 s', raw(url, chatty), channel=False)


def session_transactions(s):
    queue = PREFIX + 'tx'
    s.step('declare', lambda ch: quorum(ch, queue))
    s.step('tx.select', lambda ch: ch.tx_select())
    s.step('publish', publish('', queue, b'in tx'))
    s.step('depth before commit', depth(queue, quiet=0.3))
    s.step('tx.commit', lambda ch: ch.tx_commit())
    s.step('depth after commit', depth(queue, quiet=0.3))
    s.step('publish', publish('', queue, b'rolled back'))
    s.step('tx.rollback', lambda ch: ch.tx_rollback())
    s.step('depth after rollback', depth(queue, quiet=0.3))
    s.step('confirm.select on a tx channel', lambda ch: ch.confirm_delivery())
    s.step('tx.commit without tx.select', lambda ch: ch.tx_commit())
    s.step('confirm mode', lambda ch: s.confirm())
    s.step('tx.select on a confirm channel', lambda ch: ch.tx_select())


def session_alternate_exchange(s):
    main, alternate, queue = PREFIX + 'ae.main', PREFIX + 'ae.alternate', PREFIX + 'ae.q'
    s.step('declare the alternate exchange (fanout)',
           lambda ch: ch.exchange_declare(exchange=alternate, exchange_type='fanout'))
    s.step('declare a queue', lambda ch: quorum(ch, queue))
    s.step('bind it', lambda ch: ch.queue_bind(queue=queue, exchange=alternate))
    s.step('declare an exchange with alternate-exchange', lambda ch: ch.exchange_declare(
        exchange=main, exchange_type='direct', arguments={'alternate-exchange': alternate}))
    s.step('confirm mode', lambda ch: s.confirm())
    s.step('mandatory publish, no binding in main', publish(main, 'unbound', b'to AE',
                                                             mandatory=True))
    s.step('it is in the queue', get_when_there(queue))


SESSIONS = {
    # name: (function, extra argument names, queues, exchanges)
    'server_properties': (session_server_properties, (), [], []),
    'queue_declare_arguments': (session_queue_declare_arguments, (), queue_names_of_arguments(),
                                []),
    'queue_redeclare_inequivalent': (session_queue_redeclare_inequivalent, (),
                                     [PREFIX + 'ineq'], [PREFIX + 'ineq.x']),
    'quorum_refusals': (session_quorum_refusals, (),
                        [PREFIX + 'refused.' + n for n in ('exclusive', 'auto-delete',
                                                           'non-durable', 'all')], []),
    'missing_entities': (session_missing_entities, (), [PREFIX + 'present'],
                         [PREFIX + 'present.x']),
    'properties_roundtrip': (session_properties_roundtrip, ('user',), [PREFIX + 'props'], []),
    'user_id': (session_user_id, ('user',), [PREFIX + 'user-id'], []),
    'dead_letter_rejected': (session_dead_letter_rejected, (),
                             [PREFIX + 'rejecting', PREFIX + 'rejecting.keys',
                              *DEAD_LETTER_NAMES['queues']], DEAD_LETTER_NAMES['exchanges']),
    'dead_letter_expired': (session_dead_letter_expired, (),
                            [PREFIX + 'expiring', PREFIX + 'expiring.per-message',
                             *DEAD_LETTER_NAMES['queues']], DEAD_LETTER_NAMES['exchanges']),
    'delivery_limit': (session_delivery_limit, (), [PREFIX + 'limited',
                                                    *DEAD_LETTER_NAMES['queues']],
                       DEAD_LETTER_NAMES['exchanges']),
    'max_length': (session_max_length, (), [PREFIX + 'bounded', PREFIX + 'bounded.reject',
                                            PREFIX + 'bounded.reject-dlx',
                                            *DEAD_LETTER_NAMES['queues']],
                   DEAD_LETTER_NAMES['exchanges']),
    'permissions': (session_permissions, ('url',), [PREFIX + 'perm', PREFIX + 'perm.new'],
                    [PREFIX + 'perm.x']),
    'qos': (session_qos, (), [PREFIX + 'qos'], []),
    'delete_and_purge': (session_delete_and_purge, (), [PREFIX + 'purge'], []),
    'returns': (session_returns, (), [], [PREFIX + 'returns']),
    'consumer_cancel': (session_consumer_cancel, ('url',), [PREFIX + 'cancel'], []),
    'acks': (session_acks, (), [PREFIX + 'acks'], []),
    'exchanges': (session_exchanges, (), [PREFIX + 'x.q'], exchange_names()),
    'wire_handshake': (session_wire_handshake, ('url',), [], []),
    'wire_bad_frames': (session_wire_bad_frames, ('url',), [], []),
    'wire_heartbeat': (session_wire_heartbeat, ('url',), [], []),
    'transactions': (session_transactions, (), [PREFIX + 'tx'], []),
    'alternate_exchange': (session_alternate_exchange, (), [PREFIX + 'ae.q'],
                           [PREFIX + 'ae.main', PREFIX + 'ae.alternate']),
    'consumers': (session_consumers, ('url',), [PREFIX + 'consumers', PREFIX + 'consumers.sac',
                                                PREFIX + 'consumers.noack'], []),
}


def record(url, out, only):
    install_pika_extensions()
    user = urllib.parse.unquote(urllib.parse.urlsplit(url).username or 'guest')
    transcript = {'recorded-with': f'pika {pika.__version__}', 'sessions': {}}
    selected = {only: SESSIONS[only]} if only else SESSIONS
    for name, (function, extras, queues, exchanges) in selected.items():
        delete_names(url, queues, exchanges)
        session = Session(url)
        started = time.monotonic()
        try:
            function(session, *[{'url': url, 'user': user}[e] for e in extras])
        finally:
            session.close()
            delete_names(url, queues, exchanges)
        transcript['sessions'][name] = session.steps
        closes = sum(1 for step in session.steps if 'channel-close' in step
                     or 'connection-close' in step)
        errors = sum(1 for step in session.steps if 'error' in step)
        print(f'{name}: {len(session.steps)} steps, {closes} closes, {errors} errors '
              f'({time.monotonic() - started:.1f}s)', flush=True)
    with open(out, 'w', encoding='utf-8') as file:
        json.dump(transcript, file, indent=1, ensure_ascii=False)
        file.write('\n')
    return 0


# --- compare -------------------------------------------------------------------------------------

def flatten(value, path, into):
    """{path: leaf value}; steps are keyed by their index and label, e.g.
    sessions/acks/03 ack an unknown delivery tag/channel-close/code."""
    if isinstance(value, dict):
        if not value:
            into[path] = {}
        for key, item in value.items():
            flatten(item, f'{path}/{key}' if path else key, into)
    elif isinstance(value, list):
        if not value:
            into[path] = []
        for index, item in enumerate(value):
            if isinstance(item, dict) and 'step' in item:
                label = f"{index:02d} {item['step']}"
                flatten({k: v for k, v in item.items() if k != 'step'}, f'{path}/{label}', into)
            else:
                flatten(item, f'{path}/{index}', into)
    else:
        into[path] = value


ABSENT = '<absent>'


def compare(path_a, path_b, allow_path, common=False):
    with open(path_a, encoding='utf-8') as file:
        a = json.load(file)
    with open(path_b, encoding='utf-8') as file:
        b = json.load(file)
    allowed = []
    if allow_path:
        with open(allow_path, encoding='utf-8') as file:
            allowed = json.load(file)
    sessions_a, sessions_b = a.get('sessions', {}), b.get('sessions', {})
    unexplained = explained = 0
    for name in [*sessions_a, *[n for n in sessions_b if n not in sessions_a]]:
        if name in sessions_a and name in sessions_b:
            continue
        if common:
            continue
        unexplained += 1
        print(f'sessions/{name}: ' + ('recorded vs <absent>' if name in sessions_a
                                       else '<absent> vs recorded'))
    for name, steps in sessions_a.items():
        if name in sessions_b and [s['step'] for s in steps] != \
                [s['step'] for s in sessions_b[name]]:
            print(f'sessions/{name}: the steps differ (recorded by different versions of '
                  f'diff.py? record both with the same one)')
    per_step = {}  # (sessions, session, step) -> differences not allow-listed
    flat_a, flat_b = {}, {}
    flatten({n: s for n, s in sessions_a.items() if n in sessions_b}, 'sessions', flat_a)
    flatten({n: s for n, s in sessions_b.items() if n in sessions_a}, 'sessions', flat_b)
    paths = list(flat_a) + [p for p in flat_b if p not in flat_a]
    for path in paths:
        left, right = flat_a.get(path, ABSENT), flat_b.get(path, ABSENT)
        if left == right:
            continue
        reason = next((entry['reason'] for entry in allowed
                       if fnmatch.fnmatchcase(path, entry['path'])), None)
        shown = f'{path}: {json.dumps(left, ensure_ascii=False)} vs ' \
                f'{json.dumps(right, ensure_ascii=False)}'
        if reason is None:
            unexplained += 1
            steps = path.split('/')[:3]
            per_step[tuple(steps)] = per_step.get(tuple(steps), 0) + 1
            print(shown)
        else:
            explained += 1
            print(f'{shown}   [known: {reason}]')
    if per_step:
        print(f'steps with differences not in the allow-list ({len(per_step)}):')
        for steps, count in per_step.items():
            print(f'  {"/".join(steps[1:])}: {count}')
    print(f'{unexplained + explained} differences, {explained} known, {unexplained} not '
          f'in {allow_path or "an allow-list"}')
    return 1 if unexplained else 0


# --- setup-rabbitmq --------------------------------------------------------------------------------

def setup_rabbitmq(ctl):
    """Creates the users of the permission session on a RabbitMQ node with rabbitmqctl."""
    base = shlex.split(ctl)

    def run(*args, check=True):
        done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=120,
                              check=False)
        if check and done.returncode != 0:
            raise SystemExit(f'{" ".join([*base, *args])} failed:\n{done.stdout}{done.stderr}')

    for user in (NOCONF_USER, NOVHOST_USER):
        run('delete_user', user, check=False)
        run('add_user', user, user)
    run('set_permissions', '-p', '/', NOCONF_USER, '', '.*', '.*')
    print(f'created {NOCONF_USER} (configure nothing, write and read .* on /) and '
          f'{NOVHOST_USER} (no permissions)')
    print('# the same users on quorumq:')
    print(f'#   qqctl put-user {NOCONF_USER} --new-password {NOCONF_USER}')
    print(f"#   qqctl --vhost / set-permissions {NOCONF_USER} --configure ''")
    print(f'#   qqctl put-user {NOVHOST_USER} --new-password {NOVHOST_USER}')
    return 0


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    commands = parser.add_subparsers(dest='command', required=True)
    recording = commands.add_parser('record', help='run the sessions, write a transcript')
    recording.add_argument('url')
    recording.add_argument('out')
    recording.add_argument('--only', choices=list(SESSIONS), help='one session only')
    comparing = commands.add_parser('compare', help='compare two transcripts')
    comparing.add_argument('a')
    comparing.add_argument('b')
    comparing.add_argument('--common', action='store_true',
                           help='compare only the sessions both transcripts have (after --only)')
    comparing.add_argument('--allow', default=None,
                           help='allow-list (default: known-differences.json next to this file)')
    setting_up = commands.add_parser('setup-rabbitmq', help='create the permission users')
    setting_up.add_argument('--ctl', default='bash bench/rabbitmq.sh ctl 1',
                            help='rabbitmqctl command line (run from the repository root)')
    commands.add_parser('list', help='list the sessions')
    args = parser.parse_args(argv)
    if args.command == 'record':
        return record(args.url, args.out, args.only)
    if args.command == 'compare':
        allow = args.allow
        if allow is None:
            allow = str(__import__('pathlib').Path(__file__).with_name('known-differences.json'))
        return compare(args.a, args.b, allow, args.common)
    if args.command == 'setup-rabbitmq':
        return setup_rabbitmq(args.ctl)
    print('\n'.join(SESSIONS))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
