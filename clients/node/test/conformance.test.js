'use strict';
// clients/conformance/cases.json, the cases every helper must agree on, run on this helper.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const Redis = require('ioredis');
const { Server, waitFor } = require('./harness');
const {
  Lock, LockArgumentError, LockConnectionError, LockNotAcquired, RetryPolicy,
} = require('..');

const CASES = JSON.parse(fs.readFileSync(path.join(__dirname, '../../conformance/cases.json'), 'utf8'));
const KNOWN_CASE_FIELDS = new Set(['name', 'lock', 'server', 'setup', 'steps', 'unrepresentable', 'expect']);
const KNOWN_LOCK_FIELDS = new Set(['ttl_ms', 'wait_ms', 'shared', 'limit', 'watchdog', 'retry_attempts']);

let server;
let admin;
before(async () => {
  server = await Server.start();
  admin = server.client();
});
after(async () => {
  admin.disconnect();
  await server.stop();
});

/** The helper's settings from a case's `lock` (may throw LockArgumentError, a refusal). */
function options(lock) {
  for (const field of Object.keys(lock)) assert.ok(KNOWN_LOCK_FIELDS.has(field), `unknown lock field ${field}`);
  const out = { ttlMs: lock.ttl_ms, waitMs: lock.wait_ms, shared: lock.shared ?? false, limit: lock.limit, watchdog: lock.watchdog ?? false };
  if (lock.retry_attempts !== undefined) out.retry = new RetryPolicy({ attempts: lock.retry_attempts });
  return out;
}

async function runCase(c) {
  for (const field of Object.keys(c)) assert.ok(KNOWN_CASE_FIELDS.has(field), `unknown case field ${field}`);
  const key = `conformance:${c.name}:${crypto.randomBytes(4).toString('hex')}`;
  const sub = (args) => args.map((a) => (a === '$KEY' ? key : a));
  for (const command of c.setup ?? []) await admin.call(...sub(command));
  const closed = c.server === 'closed-port';
  const client = closed
    ? new Redis({ host: '127.0.0.1', port: 1, maxRetriesPerRequest: 0, enableOfflineQueue: false, retryStrategy: () => null, lazyConnect: true })
    : server.client();
  client.on('error', () => {});
  const expect = c.expect;
  const acquiresBefore = await server.calls('lock.acquire');
  let onLostCalls = 0;
  try {
    let lock;
    try {
      lock = new Lock(client, key, { ...options(c.lock), onLost: () => { onLostCalls += 1; } });
    } catch (error) {
      assert.ok(error instanceof LockArgumentError, `${c.name}: ${error}`);
      assert.equal(expect.acquire, 'refused', c.name);
      assert.equal(error.reason, expect.reason, c.name);
      assert.equal(await server.calls('lock.acquire'), acquiresBefore, `${c.name}: nothing sent`);
      return;
    }
    const started = Date.now();
    let outcome;
    let error;
    try {
      await lock.acquire();
      outcome = 'granted';
    } catch (e) {
      error = e;
      if (e instanceof LockNotAcquired) outcome = 'not-acquired';
      else if (e instanceof LockConnectionError) outcome = 'connection-error';
      else if (e instanceof LockArgumentError) outcome = 'refused';
      else if (e && e.name === 'ReplyError') outcome = 'server-error';
      else throw e;
    }
    assert.equal(outcome, expect.acquire, `${c.name}: ${error}`);
    if (expect.message) assert.ok(String(error.message).includes(expect.message), `${c.name}: ${error.message}`);
    if (expect.reason) assert.equal(error.reason, expect.reason, c.name);
    if (expect.within_ms) assert.ok(Date.now() - started <= expect.within_ms, `${c.name}: took ${Date.now() - started} ms`);
    for (const step of c.steps ?? []) {
      if (step.do === 'server') {
        await admin.call(...sub(step.command));
      } else if (step.do === 'wait-server-expiry') {
        await waitFor('the lease to end on the server', async () => {
          const info = await server.info(key);
          return info === null || info.state === 'free';
        });
      } else if (step.do === 'check-lost') {
        assert.equal(lock.lost, step.expect, `${c.name}: check-lost`);
      } else if (step.do === 'release') {
        assert.equal(await lock.release(), step.expect, `${c.name}: release`);
      } else {
        assert.fail(`${c.name}: unknown step ${step.do}`);
      }
    }
    if (expect.on_lost_calls !== undefined) assert.equal(onLostCalls, expect.on_lost_calls, `${c.name}: onLost calls`);
  } finally {
    client.disconnect();
  }
}

for (const c of CASES.cases) {
  test(c.name, { skip: (c.unrepresentable ?? []).includes('node') }, () => runCase(c));
}
