'use strict';
// Retries on a scripted client (no server): which errors are retried, always with the same
// token and a bounded number of times; a connection that was never made is a connection error,
// a reply lost after sending is "unknown"; the retry deadline bounds the whole acquire; release
// is retried too. The cases every helper shares (lost replies and TRYAGAIN on a real server)
// are in conformance.test.js.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { ReplyError } = require('ioredis');
const { MaxRetriesPerRequestError } = require('ioredis/built/errors');
const {
  Lock, LockConnectionError, LockNotAcquired, LockPolicyError, LockUnknown, RetryPolicy, isRetriable,
} = require('..');

const FAST = new RetryPolicy({ attempts: 4, baseMs: 1, capMs: 4 });
// What ioredis says of a command whose connection closed (it may have run), and of one it could
// not send at all (no connection, offline queue off).
const lost = () => new Error('Connection is closed.');
const refused = () => new Error("Stream isn't writeable and enableOfflineQueue options is false");

/** A client answering from a script: an Error to throw, or a reply. Each call may take `ms`
 * (the call's own duration, as a client retrying inside one call takes). */
class Scripted {
  constructor(script, ms = 0) {
    this.script = script;
    this.ms = ms;
    this.calls = [];
  }

  async call(...args) {
    this.calls.push(args);
    if (this.ms) await new Promise((resolve) => setTimeout(resolve, this.ms));
    const step = this.script.length > 1 ? this.script.shift() : this.script[0];
    if (step instanceof Error) throw step;
    return step;
  }
}

test('the server\'s try-again replies and lost connections are retried, nothing else', () => {
  for (const error of [new ReplyError('TRYAGAIN Multiple keys request during rehashing of slot'),
    new ReplyError('CLUSTERDOWN The cluster is down'), new ReplyError('UNBLOCKED force unblock'),
    new ReplyError('LOADING Redis is loading the dataset in memory'),
    new ReplyError('MASTERDOWN Link with MASTER is down'), lost(), refused(),
    new MaxRetriesPerRequestError(1), Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' })]) {
    assert.equal(isRetriable(error), true, error.message);
  }
  for (const error of [new ReplyError('MOVED 3999 127.0.0.1:6381'), new ReplyError('ASK 3999 127.0.0.1:6381'),
    new ReplyError("READONLY You can't write against a read only replica."),
    new ReplyError('WRONGTYPE Operation against a key holding the wrong kind of value'),
    new ReplyError('ERR invalid ttl-ms: must be positive'),
    new ReplyError('POLICY orders: a LABEL is required'), new TypeError('x')]) {
    assert.equal(isRetriable(error), false, error.message);
  }
});

test('acquire retries with the same token, and the same WAIT 0 each time', async () => {
  const client = new Scripted([new ReplyError('UNBLOCKED no longer a primary'),
    new ReplyError('TRYAGAIN key moved'), new ReplyError('CLUSTERDOWN failing over'), 42]);
  const lock = new Lock(client, 'k', { ttlMs: 1000, waitMs: 0, retry: FAST });
  assert.equal(await lock.acquire(), 42);
  assert.equal(client.calls.length, 4);
  assert.equal(new Set(client.calls.map((c) => c[2])).size, 1, 'one token for every try');
  assert.ok(client.calls.every((c) => c.slice(-2).join(' ') === 'WAIT 0'));
});

test('a spent wait budget ends with a plain attempt', async () => {
  const client = new Scripted([lost(), null]);
  // The pause before the retry (50 to 100 ms) outlasts the 30 ms budget.
  const lock = new Lock(client, 'k', { ttlMs: 1000, waitMs: 30, retry: new RetryPolicy({ attempts: 3, baseMs: 100, capMs: 100 }) });
  await assert.rejects(lock.acquire(), LockNotAcquired);
  assert.equal(client.calls[0][4], 'WAIT');
  assert.ok(client.calls[0][5] >= 1 && client.calls[0][5] <= 30, String(client.calls[0][5]));
  assert.equal(client.calls[1].length, 4, 'no WAIT once the budget is spent');
});

test('retries are bounded, and what the token may hold is released', async () => {
  const client = new Scripted([lost()]);
  await assert.rejects(new Lock(client, 'k', { ttlMs: 1000, retry: FAST }).acquire(), LockUnknown);
  assert.deepEqual(client.calls.map((c) => c[0]), ['LOCK.ACQUIRE', 'LOCK.ACQUIRE', 'LOCK.ACQUIRE', 'LOCK.ACQUIRE', 'LOCK.RELEASE']);
  assert.equal(new Set(client.calls.map((c) => c[2])).size, 1, 'one token throughout');
});

test('a connection never made is a connection error, at once, also after a try-again reply', async () => {
  let client = new Scripted([refused()]);
  await assert.rejects(new Lock(client, 'k', { ttlMs: 1000, retry: FAST }).acquire(), LockConnectionError);
  assert.equal(client.calls.length, 1);
  client = new Scripted([new ReplyError('TRYAGAIN key moved'), refused()]);
  await assert.rejects(new Lock(client, 'k', { ttlMs: 1000, retry: FAST }).acquire(), LockConnectionError);
  assert.equal(client.calls.length, 2);
});

test('a lost reply, then connections never made, stays unknown', async () => {
  // The first try may have been granted: the refused reconnects do not make it "nothing sent".
  const client = new Scripted([lost(), refused()]);
  await assert.rejects(new Lock(client, 'k', { ttlMs: 1000, retry: FAST }).acquire(), LockUnknown);
  assert.deepEqual(client.calls.map((c) => c[0]), ['LOCK.ACQUIRE', 'LOCK.ACQUIRE', 'LOCK.ACQUIRE', 'LOCK.ACQUIRE', 'LOCK.RELEASE']);
  // A lost reply, then a grant: the same token's fence.
  const granted = new Scripted([lost(), new MaxRetriesPerRequestError(1), 7]);
  assert.equal(await new Lock(granted, 'k', { ttlMs: 1000, retry: FAST }).acquire(), 7);
});

test('other errors are not retried', async () => {
  for (const text of ['WRONGTYPE Operation against a key holding the wrong kind of value',
    'MOVED 3999 127.0.0.1:6381', "READONLY You can't write against a read only replica."]) {
    const client = new Scripted([new ReplyError(text)]);
    await assert.rejects(new Lock(client, 'k', { ttlMs: 1000, retry: FAST }).acquire(), (e) => e instanceof ReplyError && e.message === text);
    assert.equal(client.calls.length, 1, text);
  }
});

test('the retry deadline bounds the whole acquire', async () => {
  // Calls of 100 ms that all lose their reply, 1000 attempts allowed, a 300 ms deadline.
  const client = new Scripted([lost()], 100);
  const policy = new RetryPolicy({ attempts: 1000, baseMs: 1, capMs: 1, deadlineMs: 300 });
  const started = performance.now();
  await assert.rejects(new Lock(client, 'k', { ttlMs: 1000, retry: policy }).acquire(), LockUnknown);
  const elapsed = performance.now() - started;
  assert.ok(elapsed < 1500, `${elapsed} ms`);
  const tries = client.calls.filter((c) => c[0] === 'LOCK.ACQUIRE').length;
  assert.ok(tries >= 2 && tries <= 6, `${tries} tries in ${elapsed} ms`);
});

test('release is retried with the token; a 0 after a lost reply is not a loss', async () => {
  let losses = 0;
  const client = new Scripted([7, lost(), 0]);
  const lock = new Lock(client, 'k', { ttlMs: 10_000, retry: FAST, onLost: () => { losses += 1; } });
  assert.equal(await lock.acquire(), 7);
  assert.equal(await lock.release(), false);
  assert.deepEqual(client.calls.map((c) => c[0]), ['LOCK.ACQUIRE', 'LOCK.RELEASE', 'LOCK.RELEASE']);
  assert.equal(client.calls[1][2], client.calls[0][2]);
  assert.equal(client.calls[2][2], client.calls[0][2]);
  assert.equal(losses, 0);
  // A release that could not be sent at all.
  const refusing = new Scripted([7, refused()]);
  const other = new Lock(refusing, 'k', { ttlMs: 10_000, retry: FAST });
  await other.acquire();
  await assert.rejects(other.release(), LockConnectionError);
  assert.equal(refusing.calls.length, 2);
});

test('retry policies that make no sense are refused; the defaults are the other helpers\'', () => {
  const policy = new RetryPolicy();
  assert.deepEqual({ ...policy }, { attempts: 6, baseMs: 20, capMs: 1000, deadlineMs: 10_000 });
  for (let retry = 1; retry < 12; retry += 1) {
    const pause = policy.delay(retry);
    const full = Math.min(1000, 20 * 2 ** retry);
    assert.ok(pause >= full / 2 && pause <= full, `${retry}: ${pause}`);
  }
  for (const options of [{ attempts: 0 }, { attempts: 1.5 }, { baseMs: -1 }, { capMs: -1 }, { deadlineMs: 0 }]) {
    assert.throws(() => new RetryPolicy(options), (e) => e.reason === 'retry', JSON.stringify(options));
  }
});

test('a renewal renewed but unconfirmed keeps the lock on its old lease', async () => {
  // NOREPLICAS (SYNC) and the FSYNC change error on LOCK.RENEW: the server renewed the lease
  // and could not confirm it. renew() throws the server's error; the lock is not lost, and the
  // local lease is not extended.
  for (const text of ['NOREPLICAS the change was not acknowledged by 1 replica(s) within 100 ms: a failover may lose it',
    'ERR the change was not fsynced to the AOF within 100 ms: a crash of this machine may lose it']) {
    let lostCalls = 0;
    const client = new Scripted([42, new ReplyError(text), 1]);
    const lock = new Lock(client, 'k', { ttlMs: 10_000, sync: { replicas: 1, timeoutMs: 100 },
      onLost: () => { lostCalls += 1; } });
    await lock.acquire();
    const leaseEnd = lock._leaseEnd;
    await assert.rejects(lock.renew(), (error) => error instanceof ReplyError && error.message === text);
    assert.equal(lock.lost, false, text);
    assert.equal(lock._leaseEnd, leaseEnd, 'the old lease only');
    assert.equal(await lock.release(), true);
    assert.equal(lostCalls, 0);
  }
});

test('a long-wait grant whose anchoring renewal fails is given back', async () => {
  // A grant that took longer than ttl/10 is anchored by a LOCK.RENEW. Refused by policy:
  // released, LockPolicyError. Renewed unconfirmed or failed otherwise: released, LockUnknown.
  // Answered 0: nothing to give back, LockNotAcquired. (As the Python and Rust helpers.)
  const cases = [
    [new ReplyError("POLICY orders: ttl 100 below the namespace's min-ttl 500"), LockPolicyError, true],
    [new ReplyError('NOREPLICAS the change was not acknowledged by 1 replica(s) within 100 ms: a failover may lose it'), LockUnknown, true],
    [new ReplyError('WRONGTYPE Operation against a key holding the wrong kind of value'), LockUnknown, true],
    [0, LockNotAcquired, false],
  ];
  for (const [renewal, thrown, released] of cases) {
    const client = new Scripted([42, renewal, 1], 30);
    await assert.rejects(new Lock(client, 'k', { ttlMs: 100, waitMs: 5000 }).acquire(),
      (error) => error.constructor === thrown);
    const expected = ['LOCK.ACQUIRE', 'LOCK.RENEW', ...(released ? ['LOCK.RELEASE'] : [])];
    assert.deepEqual(client.calls.map((call) => call[0]), expected, String(renewal));
  }
});
