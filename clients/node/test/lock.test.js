'use strict';
// The helper against a real server with the module: the guard's fence, refusal, waiting,
// shared holds and permits, labels, run(), the watchdog and its end at release, onLost once,
// stale fences refused by LOCK.GUARD, bad settings refused before sending, a refused
// connection, a lock namespace's refusals, SYNC and FSYNC. Retries are in retries.test.js, Redis Cluster in cluster.test.js, the cases all
// helpers share in conformance.test.js.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { Faults, Pause, Server, waitFor } = require('./harness');
const {
  Lock, LockArgumentError, LockConnectionError, LockError, LockLost, LockNotAcquired,
  LockPolicyError, RetryPolicy,
} = require('..');

let server;
let redis;
before(async () => {
  server = await Server.start();
  redis = server.client();
});
after(async () => {
  redis.disconnect();
  await server.stop();
});

const freshKey = () => `lock:${crypto.randomBytes(6).toString('hex')}`;

test('acquire gives the server fence, another token is refused, release frees it', async () => {
  const key = freshKey();
  const lock = new Lock(redis, key, { ttlMs: 10_000 });
  const fence = await lock.acquire();
  const info = await server.info(key);
  assert.equal(info.state, 'held');
  assert.equal(info.fence, fence);
  assert.equal(lock.check(), fence);
  assert.equal(await lock.fenced((f) => f * 2), fence * 2);
  await assert.rejects(new Lock(redis, key, { ttlMs: 10_000 }).acquire(), LockNotAcquired);
  let ran = false;
  await assert.rejects(new Lock(redis, key, { ttlMs: 10_000 }).run(() => { ran = true; }), LockNotAcquired);
  assert.equal(ran, false, 'the body never runs without the lock');
  assert.equal(await lock.guarded('SET', `${key}:data`, 'v'), 'OK');
  assert.equal(await lock.release(), true);
  assert.equal((await server.info(key)).state, 'free');
  assert.equal(await lock.release(), false);
});

test('a waiting acquire is granted when the holder releases', async () => {
  const key = freshKey();
  const holder = new Lock(redis, key, { ttlMs: 10_000 });
  const first = await holder.acquire();
  const waiterClient = server.client();
  try {
    const waiter = new Lock(waiterClient, key, { ttlMs: 10_000, waitMs: 5_000 });
    const granted = waiter.acquire();
    await waitFor('the waiter to block', async () => Number((await server.admin.info('clients')).match(/blocked_clients:(\d+)/)[1]) >= 1);
    await holder.release();
    const fence = await granted;
    assert.ok(fence > first);
    await waiter.release();
  } finally {
    waiterClient.disconnect();
  }
});

test('shared holders go together, a semaphore counts permits, a label shows in LOCK.WHO', async () => {
  const key = freshKey();
  const readers = [1, 2, 3].map(() => new Lock(redis, key, { ttlMs: 10_000, shared: true }));
  for (const reader of readers) await reader.acquire();
  assert.equal((await server.info(key)).holders, 3);
  await assert.rejects(new Lock(redis, key, { ttlMs: 10_000 }).acquire(), LockNotAcquired);
  for (const reader of readers) assert.equal(await reader.release(), true);
  const sem = freshKey();
  const permits = [1, 2].map(() => new Lock(redis, sem, { ttlMs: 10_000, limit: 2 }));
  for (const permit of permits) await permit.acquire();
  await assert.rejects(new Lock(redis, sem, { ttlMs: 10_000, limit: 2 }).acquire(), LockNotAcquired);
  for (const permit of permits) await permit.release();
  const labelled = new Lock(redis, key, { ttlMs: 10_000, label: 'host-7:pid-42' });
  await labelled.acquire();
  const who = await redis.call('LOCK.WHO', key);
  const holders = who[who.indexOf('holders') + 1];
  const holder = holders[0];
  assert.equal(holder[holder.indexOf('label') + 1], 'host-7:pid-42');
  await labelled.release();
});

test('run() gives the body the fence and its value back, and releases also when it throws', async () => {
  const key = freshKey();
  const lock = new Lock(redis, key, { ttlMs: 10_000 });
  assert.equal(await lock.run(async (fence) => {
    assert.equal((await server.info(key)).fence, fence);
    return 'done';
  }), 'done');
  assert.equal((await server.info(key)).state, 'free');
  await assert.rejects(lock.run(() => { throw new Error('the body failed'); }), /the body failed/);
  assert.equal((await server.info(key)).state, 'free');
});

test('the watchdog keeps the lease past its ttl', async () => {
  const key = freshKey();
  const client = new Faults(redis);
  const lock = new Lock(client, key, { ttlMs: 300, watchdog: true });
  const granted = performance.now();
  await lock.acquire();
  // Four renewals sent, so three answered: each is sent ttl/3 after the one before.
  await waitFor('three renewals', () => client.count('LOCK.RENEW') >= 4);
  assert.ok(performance.now() - granted > 300, 'longer than the ttl');
  assert.equal(lock.held, true);
  assert.equal((await server.info(key)).state, 'held');
  assert.equal(await lock.release(), true);
});

test('release waits for a paused watchdog round, which sends nothing; no renewal follows', async () => {
  // Redisson #7272 / #1626: the watchdog outlived unlock() and renewed after it.
  const key = freshKey();
  const client = new Faults(redis);
  const lock = new Lock(client, key, { ttlMs: 300, watchdog: true });
  const pause = new Pause(1); // the second round: the first renewal is done by then
  lock._beforeRenewal = pause.hook();
  await lock.acquire();
  await pause.waitReached();
  const renewals = client.count('LOCK.RENEW');
  assert.equal(renewals, 1);
  let released = null;
  const releasing = lock.release().then((r) => { released = r; });
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(released, null, 'release waits for the paused round');
  pause.go();
  await releasing;
  assert.equal(released, true);
  assert.equal(client.count('LOCK.RENEW'), renewals, 'the paused round sent nothing');
  assert.equal(client.sent.at(-1)[0], 'LOCK.RELEASE');
  // Another watchdog of the same ttl renews twice: time enough for a timer left behind to fire.
  const otherClient = new Faults(redis);
  const other = new Lock(otherClient, freshKey(), { ttlMs: 300, watchdog: true });
  await other.acquire();
  await waitFor('two renewals by another watchdog', () => otherClient.count('LOCK.RENEW') >= 2);
  await other.release();
  assert.equal(client.count('LOCK.RENEW'), renewals, 'no renewal after release');
  assert.equal((await server.info(key)).state, 'free');
});

test('a lease that runs out is reported once, and a stale fence is refused by LOCK.GUARD', async () => {
  const key = freshKey();
  let calls = 0;
  const stale = new Lock(redis, key, { ttlMs: 200, onLost: () => { calls += 1; } });
  const oldFence = await stale.acquire();
  await waitFor('the lease to end on the server', async () => (await server.info(key)).state !== 'held');
  const current = new Lock(redis, key, { ttlMs: 10_000 });
  await current.acquire();
  assert.equal(calls, 0, 'nothing noticed it yet');
  assert.equal(stale.lost, true);
  assert.equal(stale.lost, true);
  assert.equal(calls, 1, 'onLost exactly once');
  await assert.rejects(stale.guarded('SET', `${key}:data`, 'stale'), LockLost);
  await assert.rejects(redis.call('LOCK.GUARD', key, oldFence, 'SET', `${key}:data`, 'stale'), /^ReplyError: FENCED|FENCED/);
  await current.guarded('SET', `${key}:data`, 'current');
  assert.equal(await redis.get(`${key}:data`), 'current');
  assert.equal(await stale.release(), false);
  assert.equal(calls, 1);
  await current.release();
});

test('settings that make no sense are refused before anything is sent', async () => {
  const cases = [
    [{ ttlMs: 0 }, 'ttl'], [{ ttlMs: 31_536_000_001 }, 'ttl'], [{ ttlMs: 1.5 }, 'ttl'],
    [{ ttlMs: 2, watchdog: true }, 'watchdog-ttl'], [{ ttlMs: 1000, waitMs: -1 }, 'wait'],
    [{ ttlMs: 1000, limit: 0 }, 'limit'], [{ ttlMs: 1000, shared: true, limit: 2 }, 'shared+limit'],
    [{ ttlMs: 1000, label: 'two words' }, 'label'], [{ ttlMs: 1000, retry: {} }, 'retry'],
  ];
  const before = await server.calls('lock.acquire');
  for (const [options, reason] of cases) {
    assert.throws(() => new Lock(redis, freshKey(), options), (error) => error instanceof LockArgumentError && error.reason === reason, reason);
  }
  assert.throws(() => new RetryPolicy({ attempts: 0 }), (error) => error.reason === 'retry');
  assert.equal(await server.calls('lock.acquire'), before);
});

test('a refused connection is a connection error: nothing was sent', async () => {
  const Redis = require('ioredis');
  const closed = new Redis({ host: '127.0.0.1', port: 1, maxRetriesPerRequest: 0, enableOfflineQueue: false, retryStrategy: () => null, lazyConnect: true });
  closed.on('error', () => {});
  try {
    await assert.rejects(new Lock(closed, freshKey(), { ttlMs: 1000 }).acquire(), LockConnectionError);
  } finally {
    closed.disconnect();
  }
});

test('a lock namespace refusal is LockPolicyError, at once; a refused renewal counts as lost', async () => {
  const key = freshKey();
  const setPolicy = (text) => redis.call('CONFIG', 'SET', 'lock.namespaces', text);
  try {
    await setPolicy(`orders prefix=${key} mode=enforce max-ttl=30000 label=required`);
    const client = new Faults(redis, []);
    const long = new Lock(client, key, { ttlMs: 600_000, label: 'host-7' });
    const refused = await long.acquire().then(() => null, (error) => error);
    assert.ok(refused instanceof LockPolicyError && refused instanceof LockError, String(refused));
    assert.equal(refused.namespace, 'orders');
    assert.equal(refused.detail, "ttl 600000 above the namespace's max-ttl 30000");
    assert.equal(refused.cause.name, 'ReplyError');
    await assert.rejects(new Lock(client, key, { ttlMs: 10_000 }).acquire(),
      (error) => error instanceof LockPolicyError && error.detail === 'a LABEL is required');
    assert.equal(client.count('LOCK.ACQUIRE'), 2, 'one try each');
    assert.equal(await server.info(key), null, 'nothing changed');

    let lostCalls = 0;
    const lock = new Lock(redis, key, { ttlMs: 10_000, label: 'host-7', onLost: () => { lostCalls += 1; } });
    await lock.acquire();
    await setPolicy(`orders prefix=${key} mode=enforce min-ttl=20000`);
    await assert.rejects(lock.renew(),
      (error) => error instanceof LockPolicyError && error.detail === "ttl 10000 below the namespace's min-ttl 20000");
    assert.equal(lock.lost, true);
    assert.equal(lostCalls, 1, 'reported once');
    assert.throws(() => lock.check(), LockLost);
    assert.equal(await lock.release(), true, 'the grant was still there');
  } finally {
    await setPolicy('');
  }
});

test('SYNC and FSYNC reach the server', async () => {
  const key = freshKey();
  const client = new Faults(redis, []);
  // SYNC 0 answers at once.
  const lock = new Lock(client, key, { ttlMs: 10_000, sync: { replicas: 0, timeoutMs: 100 } });
  await lock.acquire();
  await lock.renew();
  assert.equal(await lock.release(), true);
  assert.deepEqual(client.sent[0].slice(3).map(String), ['10000', 'SYNC', '0', '100']);
  assert.deepEqual(client.sent[1].slice(3).map(String), ['10000', 'SYNC', '0', '100']);
  // The test server runs without an AOF.
  await assert.rejects(new Lock(redis, key, { ttlMs: 10_000, fsyncMs: 100 }).acquire(),
    (error) => error.name === 'ReplyError' && error.message.includes('FSYNC needs appendonly yes'));
});

// Review of the -POLICY / SYNC / FSYNC change (branch review8).
test('review8: a second renew() after a refused one is LockLost, not the old refusal again', async () => {
  // FAILS: _refused is set by a refused renewal and never cleared (only acquire() clears it), so
  // every later renew() of the lost grant throws the same stale LockPolicyError although it sent
  // nothing and nothing refused it. Python raises LockLost on the second renew(), Rust
  // Error::Lost: the same calls get different answers across helpers.
  const key = freshKey();
  const setPolicy = (text) => redis.call('CONFIG', 'SET', 'lock.namespaces', text);
  try {
    const client = new Faults(redis, []);
    const lock = new Lock(client, key, { ttlMs: 10_000 });
    await lock.acquire();
    await setPolicy(`orders prefix=${key} mode=enforce min-ttl=20000`);
    await assert.rejects(lock.renew(), LockPolicyError);
    const second = await lock.renew().then(() => null, (error) => error);
    assert.equal(client.count('LOCK.RENEW'), 1, 'the second renew() sent nothing');
    assert.ok(second instanceof LockLost, `second renew() threw ${second && second.constructor.name}`);
    await lock.release();
  } finally {
    await setPolicy('');
  }
});

test('review8: watchdog and renew() refused at the same time report the loss once', async () => {
  // PASSES (pins: with a watchdog renewal and an explicit renew() both in flight and both
  // answered -POLICY, onLost is called exactly once and renew() throws LockPolicyError).
  const key = freshKey();
  const setPolicy = (text) => redis.call('CONFIG', 'SET', 'lock.namespaces', text);
  try {
    const client = new Faults(redis, []);
    let lostCalls = 0;
    const lock = new Lock(client, key, { ttlMs: 1500, watchdog: true, onLost: () => { lostCalls += 1; } });
    const pause = new Pause(0);
    lock._beforeRenewal = pause.hook();
    await lock.acquire();
    await pause.waitReached();
    await setPolicy(`orders prefix=${key} mode=enforce min-ttl=5000`);
    const explicit = lock.renew().then(() => null, (error) => error);
    pause.go();
    const error = await explicit;
    await waitFor('the watchdog round to end', () => lock._renewing === null);
    assert.ok(error instanceof LockPolicyError, String(error));
    assert.equal(client.count('LOCK.RENEW'), 2, 'both renewals were sent');
    assert.equal(lostCalls, 1);
    assert.equal(await lock.release(), true);
  } finally {
    await setPolicy('');
  }
});
