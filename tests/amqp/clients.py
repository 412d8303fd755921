#!/usr/bin/env python3
"""Real-client checks of an AMQP 0-9-1 broker with pika, as RabbitMQ's tutorials write them.

    clients.py URL [URL2] [--only NAME] [--list]
    clients.py reconnect-publish URL N [--prefix P] [--timeout S]
    clients.py reconnect-drain URL [URL...] [--expect N] [--timeout S] [--delete]

The first form runs every case (or the one named by --only) and prints one line per case,
`PASS name` or `FAIL name: why`; it exits 0 only when every case passed. Cases run against
URL; with URL2 (another node of the same cluster) a cross-node case runs as well.

Every queue is a durable quorum queue (x-queue-type=quorum): where a tutorial declares an
exclusive server-named queue, the case declares a named durable one and deletes it at the end.
Names carry a per-run suffix, so runs never see each other's queues.

reconnect-publish publishes N messages with publisher confirms to the durable quorum queue
`reconnect-q` and prints how many were confirmed. reconnect-drain takes everything from it
(acking each message), reconnecting and moving on to the next URL whenever a connection fails,
and prints the sorted list of bodies as JSON. A test kills a node between the two.

The checks were validated against RabbitMQ 3.10.8: every case passes there.
"""

import argparse
import datetime
import json
import sys
import time
import uuid

import pika
import pika.exceptions

from common import Deadline, deadline, parameters

QUORUM = {'x-queue-type': 'quorum'}
WAIT = 10.0                # how long a case waits for an expected delivery
QUIET = 0.5                # how long a case waits to be sure nothing more arrives
CASE_DEADLINE = 120.0      # a case that takes longer fails (a broker that stopped answering)
CLEANUP_DEADLINE = 30.0


class CheckFailed(Exception):
    """A check of a case did not hold; the message says which."""


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


def expect_equal(actual, expected, what):
    check(actual == expected, f'{what}: expected {expected!r}, got {actual!r}')


def connect(url):
    return pika.BlockingConnection(parameters(url))


def unique(name):
    """A name no other run uses: tutorial name + run suffix."""
    return f'{name}-{uuid.uuid4().hex[:10]}'


def declare_quorum(channel, name, arguments=None):
    return channel.queue_declare(queue=name, durable=True,
                                 arguments={**QUORUM, **(arguments or {})})


def cleanup(url, queues=(), exchanges=()):
    """Deletes what a case declared, on a fresh connection; errors are ignored (best effort)."""
    try:
        with deadline(CLEANUP_DEADLINE, 'clean-up'):
            delete_all(url, queues, exchanges)
    except (Deadline, pika.exceptions.AMQPError, OSError):
        pass


def delete_all(url, queues, exchanges):
    connection = connect(url)
    try:
        for queue in queues:
            try:
                connection.channel().queue_delete(queue=queue)
            except pika.exceptions.AMQPError:
                pass
        for exchange in exchanges:
            try:
                connection.channel().exchange_delete(exchange=exchange)
            except pika.exceptions.AMQPError:
                pass
    finally:
        close_quietly(connection)


def close_quietly(connection):
    try:
        with deadline(5, 'connection.close'):
            if connection.is_open:
                connection.close()
    except (Deadline, pika.exceptions.AMQPError, OSError):
        pass


def pump_until(connection, done, timeout, what):
    """Processes I/O and callbacks until done() holds; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        left = deadline - time.monotonic()
        check(left > 0, f'timed out after {timeout}s waiting for {what}')
        connection.process_data_events(time_limit=min(0.1, left))


def pump_for(connection, seconds):
    """Processes I/O and callbacks for a while (to see that nothing more arrives)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        connection.process_data_events(time_limit=min(0.1, left))


def get_one(channel, queue, timeout=WAIT, auto_ack=True):
    """basic.get until a message arrives (dead letters arrive asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        method, properties, body = channel.basic_get(queue=queue, auto_ack=auto_ack)
        if method is not None:
            return method, properties, body
        check(time.monotonic() < deadline, f'no message in {queue} after {timeout}s')
        channel.connection.sleep(0.05)


def queue_depth(channel, queue):
    return channel.queue_declare(queue=queue, passive=True).method.message_count


class Subscriber:
    """A consumer that records the bodies it receives (auto-ack, as the tutorials' receivers)."""

    def __init__(self, url, queue):
        self.connection = connect(url)
        self.channel = self.connection.channel()
        self.bodies = []
        self.channel.basic_consume(queue=queue, on_message_callback=self._on_message,
                                   auto_ack=True)

    def _on_message(self, _channel, method, _properties, body):
        self.bodies.append((method.routing_key, body.decode()))

    def wait_for(self, count, what):
        pump_until(self.connection, lambda: len(self.bodies) >= count, WAIT, what)
        pump_for(self.connection, QUIET)  # and nothing more
        return sorted(self.bodies)

    def close(self):
        close_quietly(self.connection)


# --- Tutorial 1: "Hello World!" -----------------------------------------------------------------

def case_tutorial1_hello_world(url):
    queue = unique('hello')
    try:
        # send.py
        connection = connect(url)
        channel = connection.channel()
        declare_quorum(channel, queue)
        channel.basic_publish(exchange='', routing_key=queue, body='Hello World!')
        connection.close()

        # receive.py
        connection = connect(url)
        channel = connection.channel()
        declare_quorum(channel, queue)
        received = []

        def callback(_ch, _method, _properties, body):
            received.append(body)

        channel.basic_consume(queue=queue, on_message_callback=callback, auto_ack=True)
        pump_until(connection, lambda: received, WAIT, 'Hello World!')
        expect_equal(received, [b'Hello World!'], 'received')
        connection.close()
    finally:
        cleanup(url, queues=[queue])


# --- Tutorial 2: work queues ----------------------------------------------------------------------

def case_tutorial2_work_queues(url):
    queue = unique('task_queue')
    workers = []
    try:
        # new_task.py: persistent messages
        connection = connect(url)
        channel = connection.channel()
        declare_quorum(channel, queue)
        tasks = [f'task {i}' + '.' * (i % 3) for i in range(10)]
        for task in tasks:
            channel.basic_publish(
                exchange='', routing_key=queue, body=task,
                properties=pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent))
        connection.close()

        # worker.py, twice: prefetch 1, manual ack after the work is done
        for name in ('A', 'B'):
            worker = {'name': name, 'connection': connect(url), 'unacked': [], 'done': []}
            worker['channel'] = worker['connection'].channel()
            declare_quorum(worker['channel'], queue)
            worker['channel'].basic_qos(prefetch_count=1)

            def callback(_ch, method, _properties, body, worker=worker):
                worker['unacked'].append((method.delivery_tag, body.decode()))

            worker['channel'].basic_consume(queue=queue, on_message_callback=callback)
            workers.append(worker)

        # Prefetch 1: with nothing acked, each worker holds exactly one task.
        for worker in workers:
            pump_until(worker['connection'], lambda w=worker: w['unacked'], WAIT,
                       f"worker {worker['name']}'s first task")
        for worker in workers:
            pump_for(worker['connection'], QUIET)
            expect_equal(len(worker['unacked']), 1,
                         f"tasks held by worker {worker['name']} before any ack (prefetch 1)")

        # Work: ack one task at a time; the next one comes only after the ack.
        deadline = time.monotonic() + 3 * WAIT
        while sum(len(w['done']) for w in workers) < len(tasks):
            check(time.monotonic() < deadline, 'timed out working through the tasks')
            for worker in workers:
                check(len(worker['unacked']) <= 1,
                      f"worker {worker['name']} holds {len(worker['unacked'])} tasks with prefetch 1")
                if worker['unacked']:
                    tag, body = worker['unacked'].pop(0)
                    worker['channel'].basic_ack(delivery_tag=tag)
                    worker['done'].append(body)
                worker['connection'].process_data_events(time_limit=0.05)
        for worker in workers:
            pump_for(worker['connection'], QUIET)
            expect_equal(worker['unacked'], [], f"worker {worker['name']}'s extra deliveries")
        done = sorted(body for w in workers for body in w['done'])
        expect_equal(done, sorted(tasks), 'tasks done')
        for worker in workers:
            check(worker['done'], f"worker {worker['name']} got no task (no fair dispatch)")
        expect_equal(queue_depth(workers[0]['channel'], queue), 0, 'tasks left in the queue')
    finally:
        for worker in workers:
            close_quietly(worker['connection'])
        cleanup(url, queues=[queue])


# --- Tutorial 3: publish/subscribe ----------------------------------------------------------------

def case_tutorial3_publish_subscribe(url):
    exchange = unique('logs')
    queues = [unique('logs-sub'), unique('logs-sub')]
    subscribers = []
    try:
        # receive_logs.py, twice (a named durable quorum queue instead of an exclusive one)
        for queue in queues:
            connection = connect(url)
            channel = connection.channel()
            channel.exchange_declare(exchange=exchange, exchange_type='fanout')
            declare_quorum(channel, queue)
            channel.queue_bind(exchange=exchange, queue=queue)
            connection.close()
            subscribers.append(Subscriber(url, queue))

        # emit_log.py
        connection = connect(url)
        channel = connection.channel()
        channel.exchange_declare(exchange=exchange, exchange_type='fanout')
        messages = [f'info: Hello World! {i}' for i in range(5)]
        for message in messages:
            channel.basic_publish(exchange=exchange, routing_key='', body=message)
        connection.close()

        for number, subscriber in enumerate(subscribers):
            got = [body for _key, body in subscriber.wait_for(len(messages), 'the logs')]
            expect_equal(got, sorted(messages), f'logs received by subscriber {number}')
    finally:
        for subscriber in subscribers:
            subscriber.close()
        cleanup(url, queues=queues, exchanges=[exchange])


# --- Tutorial 4: routing --------------------------------------------------------------------------

def case_tutorial4_routing(url):
    exchange = unique('direct_logs')
    bindings = {unique('errors-only'): ['error'],
                unique('all-severities'): ['info', 'warning', 'error']}
    subscribers = {}
    try:
        # receive_logs_direct.py, twice
        for queue, severities in bindings.items():
            connection = connect(url)
            channel = connection.channel()
            channel.exchange_declare(exchange=exchange, exchange_type='direct')
            declare_quorum(channel, queue)
            for severity in severities:
                channel.queue_bind(exchange=exchange, queue=queue, routing_key=severity)
            connection.close()
            subscribers[queue] = Subscriber(url, queue)

        # emit_log_direct.py
        connection = connect(url)
        channel = connection.channel()
        channel.exchange_declare(exchange=exchange, exchange_type='direct')
        sent = [('info', 'an info'), ('warning', 'a warning'), ('error', 'an error'),
                ('debug', 'nobody listens')]
        for severity, message in sent:
            channel.basic_publish(exchange=exchange, routing_key=severity, body=message)
        connection.close()

        for queue, severities in bindings.items():
            expected = sorted((s, m) for s, m in sent if s in severities)
            got = subscribers[queue].wait_for(len(expected), f'the logs of {queue}')
            expect_equal(got, expected, f'(severity, message) received by {queue}')
    finally:
        for subscriber in subscribers.values():
            subscriber.close()
        cleanup(url, queues=list(bindings), exchanges=[exchange])


# --- Tutorial 5: topics ---------------------------------------------------------------------------

def case_tutorial5_topics(url):
    exchange = unique('topic_logs')
    q1, q2 = unique('topic-Q1'), unique('topic-Q2')
    bindings = {q1: ['*.orange.*'], q2: ['*.*.rabbit', 'lazy.#']}
    # The tutorial's examples: routing key -> the queues that get it.
    examples = {
        'quick.orange.rabbit': {q1, q2},
        'lazy.orange.elephant': {q1, q2},
        'quick.orange.fox': {q1},
        'lazy.brown.fox': {q2},
        'lazy.pink.rabbit': {q2},          # matches both of Q2's bindings, delivered once
        'quick.brown.fox': set(),
        'orange': set(),
        'quick.orange.new.rabbit': set(),
        'lazy.orange.new.rabbit': {q2},
        'lazy': {q2},                      # '#' matches zero words
    }
    subscribers = {}
    try:
        # receive_logs_topic.py, twice
        for queue, keys in bindings.items():
            connection = connect(url)
            channel = connection.channel()
            channel.exchange_declare(exchange=exchange, exchange_type='topic')
            declare_quorum(channel, queue)
            for key in keys:
                channel.queue_bind(exchange=exchange, queue=queue, routing_key=key)
            connection.close()
            subscribers[queue] = Subscriber(url, queue)

        # emit_log_topic.py
        connection = connect(url)
        channel = connection.channel()
        channel.exchange_declare(exchange=exchange, exchange_type='topic')
        for key in examples:
            channel.basic_publish(exchange=exchange, routing_key=key, body=f'message for {key}')
        connection.close()

        for queue in bindings:
            expected = sorted((k, f'message for {k}') for k, qs in examples.items() if queue in qs)
            got = subscribers[queue].wait_for(len(expected), f'the logs of {queue}')
            expect_equal(got, expected, f'(routing key, message) received by {queue}')
    finally:
        for subscriber in subscribers.values():
            subscriber.close()
        cleanup(url, queues=[q1, q2], exchanges=[exchange])


def case_tutorial2_worker_dies(url):
    """Tutorial 2, "message acknowledgment": a worker that dies before acking loses nothing;
    the task goes to another worker, marked redelivered."""
    queue = unique('task_queue')
    try:
        connection = connect(url)
        channel = connection.channel()
        declare_quorum(channel, queue)
        channel.confirm_delivery()
        channel.basic_publish(exchange='', routing_key=queue, body='a task...',
                              properties=pika.BasicProperties(
                                  delivery_mode=pika.DeliveryMode.Persistent))
        connection.close()

        dying = connect(url)
        dying_channel = dying.channel()
        dying_channel.basic_qos(prefetch_count=1)
        held = []
        dying_channel.basic_consume(queue=queue, on_message_callback=lambda *m: held.append(m))
        pump_until(dying, lambda: held, WAIT, 'the task at the first worker')
        expect_equal(held[0][1].redelivered, False, 'first delivery redelivered flag')
        dying.close()  # dies without acking

        worker = connect(url)
        channel = worker.channel()
        channel.basic_qos(prefetch_count=1)
        got = []

        def callback(ch, method, properties, body):
            got.append((method.redelivered, body))
            ch.basic_ack(delivery_tag=method.delivery_tag)

        channel.basic_consume(queue=queue, on_message_callback=callback)
        pump_until(worker, lambda: got, WAIT, 'the task at the second worker')
        pump_for(worker, QUIET)
        expect_equal(got, [(True, b'a task...')], '(redelivered, body) at the second worker')
        expect_equal(queue_depth(channel, queue), 0, 'tasks left')
        worker.close()
    finally:
        cleanup(url, queues=[queue])


# --- Publisher confirms ---------------------------------------------------------------------------

def case_publisher_confirms(url):
    """1000 publishes, each confirmed (pika raises NackError/UnroutableError otherwise)."""
    queue = unique('confirms')
    count = 1000
    try:
        connection = connect(url)
        channel = connection.channel()
        declare_quorum(channel, queue)
        channel.confirm_delivery()
        for i in range(count):
            channel.basic_publish(exchange='', routing_key=queue, body=f'message {i}',
                                  properties=pika.BasicProperties(delivery_mode=2),
                                  mandatory=True)
        expect_equal(queue_depth(channel, queue), count, 'messages in the queue after the confirms')
        expect_equal(channel.queue_purge(queue=queue).method.message_count, count, 'purged')
        connection.close()
    finally:
        cleanup(url, queues=[queue])


def case_publisher_confirms_unroutable(url):
    """A mandatory publish that no queue takes comes back as basic.return 312 NO_ROUTE."""
    exchange = unique('unroutable')
    try:
        connection = connect(url)
        channel = connection.channel()
        channel.exchange_declare(exchange=exchange, exchange_type='direct')
        channel.confirm_delivery()
        try:
            channel.basic_publish(exchange=exchange, routing_key='nobody', body=b'lost?',
                                  mandatory=True)
        except pika.exceptions.UnroutableError as error:
            expect_equal(len(error.messages), 1, 'returned messages')
            returned = error.messages[0]
            expect_equal(returned.method.NAME, 'Basic.Return', 'returned method')
            expect_equal(returned.method.reply_code, 312, 'basic.return reply-code')
            expect_equal(returned.method.reply_text, 'NO_ROUTE', 'basic.return reply-text')
            expect_equal(returned.method.exchange, exchange, 'basic.return exchange')
            expect_equal(returned.method.routing_key, 'nobody', 'basic.return routing-key')
            expect_equal(returned.body, b'lost?', 'returned body')
        else:
            raise CheckFailed('a mandatory unroutable publish was not returned')
        # Without mandatory the same publish is simply confirmed (dropped).
        channel.basic_publish(exchange=exchange, routing_key='nobody', body=b'dropped')
        connection.close()
    finally:
        cleanup(url, exchanges=[exchange])


def case_publisher_confirms_nack(url):
    """x-overflow=reject-publish: publishes past x-max-length are nacked (pika's NackError).

    RabbitMQ 3.10's quorum queues accept one message past the limit before they nack
    (max-length 1: the 2nd publish is acked, the 3rd nacked); quorumq's limits are exact.
    Both pass: the 1st publish is acked, the 3rd nacked, and the depth is what was acked."""
    queue = unique('reject-publish')
    try:
        connection = connect(url)
        channel = connection.channel()
        declare_quorum(channel, queue, {'x-max-length': 1, 'x-overflow': 'reject-publish'})
        channel.confirm_delivery()
        outcomes = []
        for i in range(3):
            try:
                channel.basic_publish(exchange='', routing_key=queue, body=f'message {i}')
                outcomes.append('ack')
            except pika.exceptions.NackError:
                outcomes.append('nack')
        check(outcomes[0] == 'ack' and outcomes[2] == 'nack',
              f'confirms of 3 publishes to a reject-publish queue of max-length 1: {outcomes}')
        expect_equal(queue_depth(channel, queue), outcomes.count('ack'), 'messages in the queue')
        connection.close()
    finally:
        cleanup(url, queues=[queue])


# --- Dead lettering -------------------------------------------------------------------------------

def check_death(properties, *, queue, reason, exchange, routing_keys, original_expiration=None):
    """Checks a dead letter's x-death (one death) and x-first-death-* / x-last-death-* headers.

    x-last-death-* are checked when present: RabbitMQ 3.10 does not write them (3.13 does)."""
    headers = properties.headers or {}
    deaths = headers.get('x-death')
    check(isinstance(deaths, list), f'x-death is not a list: {deaths!r}')
    expect_equal(len(deaths), 1, 'number of x-death tables')
    death = deaths[0]
    check(isinstance(death, dict), f'x-death[0] is not a table: {death!r}')
    check(isinstance(death.get('count'), int) and not isinstance(death.get('count'), bool),
          f"x-death count is not an integer: {death.get('count')!r}")
    expect_equal(death.get('count'), 1, 'x-death count')
    expect_equal(death.get('reason'), reason, 'x-death reason')
    expect_equal(death.get('queue'), queue, 'x-death queue')
    expect_equal(death.get('exchange'), exchange, 'x-death exchange')
    expect_equal(death.get('routing-keys'), routing_keys, 'x-death routing-keys')
    died = death.get('time')
    check(isinstance(died, datetime.datetime), f'x-death time is not a timestamp: {died!r}')
    now = datetime.datetime.now(datetime.timezone.utc)
    check(abs((now - died).total_seconds()) < 300, f'x-death time {died} is not about now ({now})')
    if original_expiration is None:
        check('original-expiration' not in death,
              f"x-death has original-expiration {death.get('original-expiration')!r}")
    else:
        expect_equal(death.get('original-expiration'), original_expiration,
                     'x-death original-expiration')
    expected = {'queue': queue, 'reason': reason, 'exchange': exchange}
    for field, value in expected.items():
        expect_equal(headers.get(f'x-first-death-{field}'), value, f'x-first-death-{field}')
        if f'x-last-death-{field}' in headers:
            expect_equal(headers[f'x-last-death-{field}'], value, f'x-last-death-{field}')
    check(properties.expiration is None,
          f'the dead letter still has expiration {properties.expiration!r}')


def dead_letter_topology(channel, names, source_arguments):
    """source queue --(DLX, routing key 'dead')--> target queue; returns nothing."""
    channel.exchange_declare(exchange=names['dlx'], exchange_type='direct', durable=True)
    declare_quorum(channel, names['target'])
    channel.queue_bind(queue=names['target'], exchange=names['dlx'], routing_key='dead')
    channel.exchange_declare(exchange=names['entry'], exchange_type='direct', durable=True)
    declare_quorum(channel, names['source'], {'x-dead-letter-exchange': names['dlx'],
                                              'x-dead-letter-routing-key': 'dead',
                                              **source_arguments})
    channel.queue_bind(queue=names['source'], exchange=names['entry'], routing_key='work')


def dead_letter_names():
    return {'dlx': unique('dlx'), 'target': unique('dead-letters'),
            'entry': unique('work-exchange'), 'source': unique('work')}


def run_dead_letter_case(url, source_arguments, publish_properties, kill, reason,
                         original_expiration=None):
    names = dead_letter_names()
    try:
        connection = connect(url)
        channel = connection.channel()
        dead_letter_topology(channel, names, source_arguments)
        channel.confirm_delivery()
        headers = {'app-header': 'kept', 'attempt': 1}
        channel.basic_publish(
            exchange=names['entry'], routing_key='work', body=b'payload',
            properties=pika.BasicProperties(headers=headers, message_id='m-1',
                                            **publish_properties))
        kill(channel, names['source'])
        method, properties, body = get_one(channel, names['target'])
        expect_equal(body, b'payload', 'dead letter body')
        expect_equal(method.exchange, names['dlx'], 'dead letter exchange')
        expect_equal(method.routing_key, 'dead', 'dead letter routing key')
        expect_equal(properties.message_id, 'm-1', 'dead letter message-id')
        for key, value in headers.items():
            expect_equal((properties.headers or {}).get(key), value, f'dead letter header {key}')
        check_death(properties, queue=names['source'], reason=reason, exchange=names['entry'],
                    routing_keys=['work'], original_expiration=original_expiration)
        expect_equal(queue_depth(channel, names['source']), 0, 'messages left in the source')
        connection.close()
    finally:
        cleanup(url, queues=[names['source'], names['target']],
                exchanges=[names['entry'], names['dlx']])


def reject_first(channel, queue):
    method, _properties, _body = get_one(channel, queue, auto_ack=False)
    channel.basic_reject(delivery_tag=method.delivery_tag, requeue=False)


def wait_for_expiry(_channel, _queue):
    pass  # get_one on the target waits for the dead letter


def case_dead_letter_rejected(url):
    run_dead_letter_case(url, {}, {}, reject_first, 'rejected')


def case_dead_letter_expired_queue_ttl(url):
    run_dead_letter_case(url, {'x-message-ttl': 200}, {}, wait_for_expiry, 'expired')


def case_dead_letter_expired_message_ttl(url):
    run_dead_letter_case(url, {}, {'expiration': '200'}, wait_for_expiry, 'expired',
                         original_expiration='200')


def delivery_count(properties):
    return (properties.headers or {}).get('x-delivery-count')


def case_redelivery_count(url):
    """basic.reject requeue=true: the message comes back redelivered with x-delivery-count 1,
    then 2 (absent or 0 on the first delivery: RabbitMQ 3.10 sends 0 with basic.get and
    nothing with basic.deliver)."""
    queue = unique('redelivery')
    try:
        connection = connect(url)
        channel = connection.channel()
        declare_quorum(channel, queue)
        channel.confirm_delivery()
        channel.basic_publish(exchange='', routing_key=queue, body=b'again')
        got = []
        tag = channel.basic_consume(queue=queue, on_message_callback=lambda *m: got.append(m))
        for attempt in range(3):
            pump_until(connection, lambda n=attempt: len(got) > n, WAIT, f'delivery {attempt + 1}')
            _ch, method, properties, body = got[attempt]
            expect_equal(body, b'again', f'delivery {attempt + 1} body')
            expect_equal(method.redelivered, attempt > 0, f'delivery {attempt + 1} redelivered')
            count = delivery_count(properties)
            if attempt == 0:
                check(count in (None, 0), f'first delivery x-delivery-count: {count!r}')
            else:
                expect_equal(count, attempt, f'delivery {attempt + 1} x-delivery-count')
            if attempt < 2:
                # A reject with requeue is a failed delivery on every RabbitMQ and here; a
                # nack with requeue is one only before RabbitMQ 4.3 (the Rust cluster test
                # delivery_counts covers it).
                channel.basic_reject(delivery_tag=method.delivery_tag, requeue=True)
            else:
                channel.basic_ack(delivery_tag=method.delivery_tag)
        pump_for(connection, QUIET)
        expect_equal(len(got), 3, 'deliveries')
        channel.basic_cancel(consumer_tag=tag)

        # The same with basic.get.
        channel.basic_publish(exchange='', routing_key=queue, body=b'get me')
        method, properties, _body = get_one(channel, queue, auto_ack=False)
        check(method.redelivered is False and delivery_count(properties) in (None, 0),
              f'first get: redelivered {method.redelivered}, '
              f'x-delivery-count {delivery_count(properties)!r}')
        # A reject with requeue (a nack with requeue is a release, not a failure, as for a
        # consumer's delivery: the Rust cluster test delivery_counts covers it).
        channel.basic_reject(delivery_tag=method.delivery_tag, requeue=True)
        method, properties, _body = get_one(channel, queue, auto_ack=True)
        expect_equal((method.redelivered, delivery_count(properties)), (True, 1),
                     'second get (redelivered, x-delivery-count)')
        connection.close()
    finally:
        cleanup(url, queues=[queue])


# --- Consumer cancel notification -----------------------------------------------------------------

def case_consumer_cancel_on_queue_delete(url):
    """A consumer whose queue another connection deletes gets basic.cancel from the broker."""
    queue = unique('cancel-me')
    connection = None
    try:
        connection = connect(url)
        check(connection._impl.server_capabilities.get('consumer_cancel_notify'),  # pylint: disable=protected-access
              'the broker does not announce consumer_cancel_notify')
        channel = connection.channel()
        declare_quorum(channel, queue)
        cancels = []
        channel.add_on_cancel_callback(cancels.append)
        tag = channel.basic_consume(queue=queue, on_message_callback=lambda *_: None,
                                    consumer_tag='cancel-test-consumer')

        other = connect(url)
        other.channel().queue_delete(queue=queue)
        other.close()

        pump_until(connection, lambda: cancels, WAIT, 'basic.cancel from the broker')
        frame = cancels[0]
        expect_equal(frame.method.NAME, 'Basic.Cancel', 'method')
        expect_equal(frame.method.consumer_tag, tag, 'cancelled consumer tag')
        check(channel.is_open, 'the channel closed (only the consumer should end)')
        expect_equal(channel.consumer_tags, [], 'consumers left on the channel')
        # The channel keeps working.
        channel.basic_qos(prefetch_count=1)
        connection.close()
    finally:
        if connection is not None:
            close_quietly(connection)
        cleanup(url, queues=[queue])


# --- Two nodes --------------------------------------------------------------------------------------

def case_cross_node(url, url2):
    """Declared and published (confirmed) on one node, consumed and acked on another."""
    queue = unique('cross-node')
    try:
        connection = connect(url)
        channel = connection.channel()
        declare_quorum(channel, queue)
        channel.confirm_delivery()
        bodies = [f'cross {i}' for i in range(20)]
        for body in bodies:
            channel.basic_publish(exchange='', routing_key=queue, body=body)
        connection.close()

        connection = connect(url2)
        channel = connection.channel()
        expect_equal(queue_depth(channel, queue), len(bodies), 'depth seen from the other node')
        channel.basic_qos(prefetch_count=5)
        got = []

        def callback(ch, method, _properties, body):
            got.append(body.decode())
            ch.basic_ack(delivery_tag=method.delivery_tag)

        channel.basic_consume(queue=queue, on_message_callback=callback)
        pump_until(connection, lambda: len(got) >= len(bodies), WAIT, 'the messages')
        expect_equal(got, bodies, 'bodies in order')
        connection.close()
    finally:
        cleanup(url, queues=[queue])


# --- Void header values, as Celery sends them -----------------------------------------------------

def case_void_headers(url):
    """Celery's task messages carry headers set to None (`eta`, `expires`, ...); its worker
    fails on a delivered header that is anything else. Void must come back as void, nested too,
    through a consumer and through basic.get."""
    queue = unique('celery_like')
    headers = {'lang': 'py', 'task': 'tasks.add', 'eta': None, 'expires': None,
               'nested': {'k': None, 'list': [None, 1]}}
    try:
        connection = connect(url)
        channel = connection.channel()
        declare_quorum(channel, queue)
        channel.confirm_delivery()

        def publish():
            channel.basic_publish(exchange='', routing_key=queue, body=b'{}',
                                  properties=pika.BasicProperties(headers=headers))

        publish()
        got = []

        def callback(ch, method, properties, _body):
            got.append(properties.headers)
            ch.basic_ack(delivery_tag=method.delivery_tag)
            ch.basic_cancel(consumer_tag=method.consumer_tag)

        channel.basic_qos(prefetch_count=1)
        channel.basic_consume(queue=queue, on_message_callback=callback)
        pump_until(connection, lambda: got, WAIT, 'the delivery')
        publish()
        _method, properties, _body = get_one(channel, queue)
        got.append(properties.headers)
        for how, received in zip(('consumed', 'basic.get'), got):
            for key, value in headers.items():
                expect_equal(received.get(key), value, f'{how}: header {key}')
        connection.close()
    finally:
        cleanup(url, queues=[queue])


CASES = {
    'tutorial1_hello_world': case_tutorial1_hello_world,
    'tutorial2_work_queues': case_tutorial2_work_queues,
    'tutorial2_worker_dies': case_tutorial2_worker_dies,
    'tutorial3_publish_subscribe': case_tutorial3_publish_subscribe,
    'tutorial4_routing': case_tutorial4_routing,
    'tutorial5_topics': case_tutorial5_topics,
    'publisher_confirms': case_publisher_confirms,
    'publisher_confirms_unroutable': case_publisher_confirms_unroutable,
    'publisher_confirms_nack': case_publisher_confirms_nack,
    'dead_letter_rejected': case_dead_letter_rejected,
    'dead_letter_expired_queue_ttl': case_dead_letter_expired_queue_ttl,
    'dead_letter_expired_message_ttl': case_dead_letter_expired_message_ttl,
    'redelivery_count': case_redelivery_count,
    'consumer_cancel_on_queue_delete': case_consumer_cancel_on_queue_delete,
    'void_headers': case_void_headers,
}
TWO_NODE_CASES = {'cross_node': case_cross_node}


def run_cases(url, url2, only):
    selected = {**CASES, **(TWO_NODE_CASES if url2 else {})}
    if only:
        if only not in selected:
            known = ', '.join([*CASES, *TWO_NODE_CASES])
            print(f'FAIL {only}: no such case (or it needs URL2); cases: {known}')
            return 1
        selected = {only: selected[only]}
    failed = 0
    for name, case in selected.items():
        try:
            with deadline(CASE_DEADLINE, name):
                if name in TWO_NODE_CASES:
                    case(url, url2)
                else:
                    case(url)
        except (CheckFailed, Deadline) as error:
            failed += 1
            print(f'FAIL {name}: {error}', flush=True)
        except Exception as error:  # pylint: disable=broad-except
            failed += 1
            print(f'FAIL {name}: {type(error).__name__}: {error!r}', flush=True)
        else:
            print(f'PASS {name}', flush=True)
    return 1 if failed else 0


# --- Reconnect (a node is killed between the two subcommands) ---------------------------------------

RECONNECT_QUEUE = 'reconnect-q'


def reconnect_publish(url, count, prefix, timeout):
    """Prints how many messages were confirmed: PREFIX-0 .. PREFIX-(printed - 1) (each publish
    waits for its confirm). Exits 1 when not all N were."""
    confirmed = 0
    try:
        with deadline(timeout, 'reconnect-publish'):
            connection = connect(url)
            channel = connection.channel()
            declare_quorum(channel, RECONNECT_QUEUE)
            channel.confirm_delivery()
            for i in range(count):
                channel.basic_publish(exchange='', routing_key=RECONNECT_QUEUE,
                                      body=f'{prefix}-{i}',
                                      properties=pika.BasicProperties(delivery_mode=2))
                confirmed += 1  # pika raised if the broker nacked it or the connection failed
            connection.close()
    except (Deadline, pika.exceptions.AMQPError, OSError) as error:
        print(f'reconnect-publish: stopped after {confirmed} confirms: {error!r}',
              file=sys.stderr)
    print(confirmed)
    return 0 if confirmed == count else 1


def reconnect_drain(urls, expect, timeout, delete):
    """Takes every message from reconnect-q; moves to the next URL when a connection fails.
    Prints the sorted bodies as JSON; exits 1 when --expect was not reached."""
    deadline_at = time.monotonic() + timeout
    bodies = set()
    attempt = 0
    while True:
        url = urls[attempt % len(urls)]
        attempt += 1
        try:
            with deadline(max(deadline_at - time.monotonic(), 0.001), 'reconnect-drain'):
                drain_from(url, bodies, expect, deadline_at, delete)
            break
        except (TimeoutError, Deadline):
            print(f'reconnect-drain: timed out after {timeout}s with {len(bodies)} bodies',
                  file=sys.stderr)
            break
        except (pika.exceptions.AMQPError, OSError) as error:
            if time.monotonic() > deadline_at:
                print(f'reconnect-drain: gave up: {error!r}', file=sys.stderr)
                break
            print(f'reconnect-drain: {url}: {error!r}; retrying', file=sys.stderr)
            time.sleep(0.5)
    print(json.dumps(sorted(bodies)))
    return 0 if expect is None or len(bodies) >= expect else 1


def drain_from(url, bodies, expect, deadline_at, delete):
    """basic.get + ack from reconnect-q into `bodies`, until the queue answered get-empty twice
    in a row (and, with --expect, that many distinct bodies came)."""
    connection = connect(url)
    try:
        channel = connection.channel()
        empties = 0
        while empties < 2 or (expect is not None and len(bodies) < expect):
            if time.monotonic() > deadline_at:
                raise TimeoutError
            method, _properties, body = channel.basic_get(queue=RECONNECT_QUEUE)
            if method is None:
                empties += 1
                connection.sleep(0.25)
                continue
            empties = 0
            bodies.add(body.decode())
            channel.basic_ack(delivery_tag=method.delivery_tag)
        if delete:
            channel.queue_delete(queue=RECONNECT_QUEUE)
    finally:
        close_quietly(connection)


def main(argv):
    if argv and argv[0] == 'reconnect-publish':
        parser = argparse.ArgumentParser(prog='clients.py reconnect-publish')
        parser.add_argument('url')
        parser.add_argument('count', type=int)
        parser.add_argument('--prefix', default='m', help='bodies are PREFIX-0 .. PREFIX-(N-1)')
        parser.add_argument('--timeout', type=float, default=120.0)
        args = parser.parse_args(argv[1:])
        return reconnect_publish(args.url, args.count, args.prefix, args.timeout)
    if argv and argv[0] == 'reconnect-drain':
        parser = argparse.ArgumentParser(prog='clients.py reconnect-drain')
        parser.add_argument('urls', nargs='+', metavar='URL', help='tried in turn')
        parser.add_argument('--expect', type=int, help='keep draining until N distinct bodies')
        parser.add_argument('--timeout', type=float, default=60.0)
        parser.add_argument('--delete', action='store_true', help='delete reconnect-q at the end')
        args = parser.parse_args(argv[1:])
        return reconnect_drain(args.urls, args.expect, args.timeout, args.delete)
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('url')
    parser.add_argument('url2', nargs='?', help='another node of the same cluster')
    parser.add_argument('--only', metavar='NAME', help='run this case only')
    parser.add_argument('--list', action='store_true', help='list the cases and exit')
    args = parser.parse_args(argv)
    if args.list:
        print('\n'.join([*CASES, *TWO_NODE_CASES]))
        return 0
    return run_cases(args.url, args.url2, args.only)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
