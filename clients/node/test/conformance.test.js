'use strict';
// clients/conformance/cases.json, the cases every helper must agree on, run on this helper.
// clients/conformance/README.md describes the format. One server for all cases, a fresh key per
// case, one test per case. Faults are injected by harness.Faults (a wrapper for the client) and
// harness.Pause (the watchdog's pause seam, lock._beforeRenewal). With CONFORMANCE_RESULTS set,
// each case's result is appended to that file.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const Redis = require('ioredis');
const { Faults, Pause, Server, waitFor } = require('./harness');
const {
  Lock, LockArgumentError, LockConnectionError, LockNotAcquired, LockPolicyError, LockUnknown,
  RetryPolicy,
} = require('..');

const HELPER = 'node';
const CASES = JSON.parse(fs.readFileSync(path.join(__dirname, '../../conformance/cases.json'), 'utf8'));
const CASE_FIELDS = new Set(['name', 'lock', 'server', 'namespaces', 'setup', 'faults', 'steps', 'unrepresentable', 'expect']);
const LOCK_FIELDS = new Set(['ttl_ms', 'wait_ms', 'shared', 'limit', 'watchdog', 'retry_attempts', 'sync', 'fsync_ms']);
const EXPECT_FIELDS = new Set(['acquire', 'reason', 'message', 'namespace', 'detail', 'within_ms', 'on_lost_calls', 'sent', 'one_token']);
const FAULT_FIELDS = new Set(['at', 'nth', 'fault', 'error']);
/** Each step and the fields it takes besides `do`. */
const STEPS = {
  server: ['command'],
  'wait-server-expiry': [],
  'check-lost': ['expect'],
  release: ['expect'],
  'check-server': ['expect'],
  'wait-sent': ['command', 'count'],
  'wait-paused': [],
  resume: [],
  'wait-lost-reported': [],
};
/** Steps that use the helper's grant; the others may follow an acquire that granted nothing. */
const GRANT_STEPS = new Set(['check-lost', 'release', 'wait-sent', 'wait-paused', 'resume', 'wait-lost-reported']);
/** The commands whose third word is the helper's token. */
const TOKEN_COMMANDS = new Set(['LOCK.ACQUIRE', 'LOCK.RENEW', 'LOCK.RELEASE']);

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
  const out = { ttlMs: lock.ttl_ms, waitMs: lock.wait_ms, shared: lock.shared ?? false, limit: lock.limit, watchdog: lock.watchdog ?? false };
  if (lock.retry_attempts !== undefined) out.retry = new RetryPolicy({ attempts: lock.retry_attempts });
  if (lock.sync !== undefined) out.sync = { replicas: lock.sync[0], timeoutMs: lock.sync[1] };
  if (lock.fsync_ms !== undefined) out.fsyncMs = lock.fsync_ms;
  return out;
}

function checkFields(c) {
  const unknown = (fields, known, what) => {
    for (const field of Object.keys(fields)) assert.ok(known.has(field), `${c.name}: unknown ${what} field ${field}`);
  };
  unknown(c, CASE_FIELDS, 'case');
  unknown(c.lock, LOCK_FIELDS, 'lock');
  unknown(c.expect, EXPECT_FIELDS, 'expect');
  for (const fault of c.faults ?? []) {
    unknown(fault, FAULT_FIELDS, 'fault');
    assert.ok(['drop-reply', 'reply-error', 'pause'].includes(fault.fault), `${c.name}: fault ${fault.fault}`);
    assert.equal(fault.fault === 'pause', fault.at === 'watchdog', `${c.name}: a pause is the watchdog's`);
    assert.equal('error' in fault, fault.fault === 'reply-error', `${c.name}: error goes with reply-error`);
  }
  for (const step of c.steps ?? []) {
    assert.ok(step.do in STEPS, `${c.name}: unknown step ${step.do}`);
    assert.deepEqual(Object.keys(step).filter((f) => f !== 'do').sort(), [...STEPS[step.do]].sort(), `${c.name}: fields of ${step.do}`);
  }
}

async function runCase(c) {
  checkFields(c);
  const key = `conformance:${c.name}:${crypto.randomBytes(4).toString('hex')}`;
  const sub = (args) => args.map((a) => (typeof a === 'string' ? a.replaceAll('$KEY', key) : a));
  if (c.namespaces === undefined) return runCaseWithKey(c, key, sub);
  // The server is shared by every case: its policy is cleared whatever the case did.
  try {
    await admin.call(...sub(['CONFIG', 'SET', 'lock.namespaces', c.namespaces]));
    return await runCaseWithKey(c, key, sub);
  } finally {
    await admin.call('CONFIG', 'SET', 'lock.namespaces', '');
  }
}

async function runCaseWithKey(c, key, sub) {
  for (const command of c.setup ?? []) await admin.call(...sub(command));
  let real;
  if (c.server === 'closed-port') {
    real = new Redis({ host: '127.0.0.1', port: 1, maxRetriesPerRequest: 0, enableOfflineQueue: false, retryStrategy: () => null, lazyConnect: true });
  } else {
    assert.equal(c.server ?? 'running', 'running', `${c.name}: unknown server`);
    real = server.client();
  }
  real.on('error', () => {});
  const faults = c.faults ?? [];
  const client = new Faults(real, faults);
  // The watchdog's rounds count from 0.
  const pause = faults.filter((f) => f.at === 'watchdog').map((f) => new Pause(f.nth - 1))[0];
  const expect = c.expect;
  const acquiresBefore = await server.calls('lock.acquire');
  let onLostCalls = 0;
  let lock;
  try {
    try {
      lock = new Lock(client, key, { ...options(c.lock), onLost: () => { onLostCalls += 1; } });
    } catch (error) {
      assert.ok(error instanceof LockArgumentError, `${c.name}: ${error}`);
      assert.equal(expect.acquire, 'refused', c.name);
      assert.equal(error.reason, expect.reason, c.name);
      assert.equal(await server.calls('lock.acquire'), acquiresBefore, `${c.name}: nothing sent`);
      return;
    }
    if (pause) lock._beforeRenewal = pause.hook();
    const started = Date.now();
    let outcome;
    let error;
    let fence = null;
    try {
      fence = await lock.acquire();
      outcome = 'granted';
    } catch (e) {
      error = e;
      if (e instanceof LockNotAcquired) outcome = 'not-acquired';
      else if (e instanceof LockConnectionError) outcome = 'connection-error';
      else if (e instanceof LockUnknown) outcome = 'unknown';
      else if (e instanceof LockPolicyError) outcome = 'policy';
      else if (e instanceof LockArgumentError) outcome = 'refused';
      else if (e && e.name === 'ReplyError') outcome = 'server-error';
      else throw e;
    }
    assert.equal(outcome, expect.acquire, `${c.name}: ${error}`);
    if (expect.message) assert.ok(String(error.message).includes(expect.message), `${c.name}: ${error.message}`);
    if (expect.reason) assert.equal(error.reason, expect.reason, c.name);
    if (outcome === 'policy') {
      assert.equal(error.namespace, expect.namespace, `${c.name}: the namespace`);
      assert.ok(error.detail.includes(expect.detail ?? ''), `${c.name}: ${error.detail}`);
    }
    if (expect.within_ms) assert.ok(Date.now() - started <= expect.within_ms, `${c.name}: took ${Date.now() - started} ms`);
    for (const step of c.steps ?? []) {
      if (fence === null) assert.ok(!GRANT_STEPS.has(step.do), `${c.name}: ${step.do} needs a grant`);
      if (step.do === 'server') {
        await admin.call(...sub(step.command));
      } else if (step.do === 'wait-server-expiry') {
        await waitFor('the lease to end on the server', async () => {
          const info = await server.info(key);
          return info === null || info.state !== 'held';
        });
      } else if (step.do === 'check-server') {
        const info = await server.info(key);
        for (const [field, value] of Object.entries(step.expect)) {
          const wanted = value === '$FENCE' ? fence : value;
          const got = field === 'state' && info === null ? 'none' : info?.[field];
          assert.equal(got, wanted, `${c.name}: LOCK.INFO ${field}`);
        }
      } else if (step.do === 'check-lost') {
        assert.equal(lock.lost, step.expect, `${c.name}: check-lost`);
      } else if (step.do === 'release') {
        assert.equal(await lock.release(), step.expect, `${c.name}: release`);
      } else if (step.do === 'wait-sent') {
        await waitFor(`${step.count} ${step.command} sent`, () => client.count(step.command) >= step.count);
      } else if (step.do === 'wait-paused') {
        assert.ok(pause, `${c.name}: wait-paused without a pause fault`);
        await pause.waitReached();
      } else if (step.do === 'resume') {
        pause?.go();
      } else if (step.do === 'wait-lost-reported') {
        await waitFor('onLost to be called', () => onLostCalls > 0);
      } else {
        assert.fail(`${c.name}: unknown step ${step.do}`);
      }
    }
    if (lock._token !== null) await lock.release();
    assert.equal(onLostCalls, expect.on_lost_calls ?? 0, `${c.name}: onLost calls`);
    for (const [command, count] of Object.entries(expect.sent ?? {})) {
      assert.equal(client.count(command), count, `${c.name}: ${command} sent`);
    }
    if (expect.one_token) {
      const tokens = new Set(client.sent.filter((args) => TOKEN_COMMANDS.has(String(args[0]).toUpperCase())).map((args) => args[2]));
      assert.equal(tokens.size, 1, `${c.name}: one token throughout`);
    }
  } finally {
    pause?.go(); // never leave a watchdog hanging on a failed case
    if (lock && lock._token !== null) await lock.release().catch(() => {});
    real.disconnect();
  }
}

function record(name, result) {
  if (process.env.CONFORMANCE_RESULTS) fs.appendFileSync(process.env.CONFORMANCE_RESULTS, `${HELPER}\t${name}\t${result}\n`);
}

for (const c of CASES.cases) {
  const skip = (c.unrepresentable ?? []).includes(HELPER);
  test(c.name, { skip }, async () => {
    try {
      await runCase(c);
      record(c.name, 'pass');
    } catch (error) {
      record(c.name, 'fail');
      throw error;
    }
  });
  if (skip) record(c.name, 'skip');
}
