'use strict';
// Redis Cluster through ioredis' Cluster client: a lock whose slot migrates keeps its watchdog
// and is released on the new owner; a waiter whose key moves is sent again (same token) and
// served there; guarded writes go to the lock's slot. Three primaries with the module, started
// and stopped here (harness.Cluster, as clients/python's tests do it).
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { Cluster, waitFor } = require('./harness');
const { Lock } = require('..');

let cluster;
let rc;
before(async () => {
  cluster = await Cluster.start(3);
  rc = cluster.client();
});
after(async () => {
  rc?.disconnect();
  await cluster?.stop();
});

test('the watchdog follows the lock to its new node, and release frees it there', async () => {
  const key = '{order:1}:lock';
  let losses = 0;
  const lock = new Lock(rc, key, { ttlMs: 300, watchdog: true, onLost: () => { losses += 1; } });
  const fence = await lock.acquire();
  const source = await cluster.ownerOf(key);
  const target = (source + 1) % 3;
  await cluster.migrateKeySlot(key, source, target);
  const owner = cluster.nodes[target];
  const renewals = await owner.calls('lock.renew');
  // More than the ttl passes: the lease lives on only because renewals reach the new owner.
  await waitFor('three renewals on the new owner', async () => (await owner.calls('lock.renew')) >= renewals + 3);
  assert.equal(losses, 0);
  assert.equal(lock.held, true);
  assert.equal(await owner.admin.call('LOCK.FENCE', key, fence), 1);
  assert.equal(await lock.release(), true);
  assert.equal((await owner.info(key)).state, 'free');
  assert.equal(losses, 0);
});

test('a waiter whose key moves is retried with its token and served on the new node', async () => {
  const key = '{order:2}:lock';
  const holder = new Lock(rc, key, { ttlMs: 10_000 });
  const held = await holder.acquire();
  const source = await cluster.ownerOf(key);
  const target = (source + 1) % 3;
  const src = cluster.nodes[source];
  const dst = cluster.nodes[target];
  // A waiting acquire blocks its connection: the waiter has a client of its own.
  const waiterClient = cluster.client();
  try {
    const waiter = new Lock(waiterClient, key, { ttlMs: 10_000, waitMs: 20_000 });
    const granted = waiter.acquire();
    await waitFor('the waiter to queue', async () => (await src.info(key)).waiters === 1);
    // MIGRATE takes the key: the module answers the waiter -TRYAGAIN. ioredis' Cluster sends
    // the same command again itself (same token; the helper retries a TRYAGAIN that reaches
    // it, as retries.test.js shows), and MOVED/ASK take it to the new owner, where it queues
    // until the holder lets go.
    await cluster.migrateKeySlot(key, source, target);
    await waitFor('the waiter to queue on the new owner', async () => (await dst.info(key))?.waiters === 1);
    assert.equal(await holder.release(), true);
    const fence = await granted;
    assert.ok(fence > held);
    const info = await dst.info(key);
    assert.equal(info.state, 'held');
    assert.equal(info.fence, fence);
    assert.equal(await waiter.release(), true);
    assert.equal((await dst.info(key)).state, 'free');
  } finally {
    waiterClient.disconnect();
  }
});

test('guarded writes go to the lock\'s slot; another slot is refused before anything runs', async () => {
  const key = '{order:3}:lock';
  const lock = new Lock(rc, key, { ttlMs: 10_000 });
  await lock.run(async () => {
    assert.equal(await lock.guarded('SET', '{order:3}:data', 'v'), 'OK');
    await assert.rejects(lock.guarded('SET', '{order:4}:data', 'v'), /slot/i);
  });
  assert.equal(await rc.get('{order:3}:data'), 'v');
  assert.equal(await rc.get('{order:4}:data'), null);
});
