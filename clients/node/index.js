'use strict';
// A lock over the lock module's LOCK.* commands, for ioredis: a fresh random token per grant,
// the fence handed to your code, an opt-in watchdog that never renews a lease that may already
// have ended and is stopped before the release is sent, onLost called once, fenced and guarded
// calls, and retries with the same token. The same shape as clients/python and clients/rust.

const crypto = require('node:crypto');

/** The longest lease a server accepts (the highest lock.max-ttl: one year), in ms. */
const MAX_TTL_MS = 31_536_000_000;
/** The longest WAIT a server accepts, in ms. */
const MAX_WAIT_MS = 2 ** 45;
/** The most permits a semaphore can have. */
const MAX_LIMIT = 10_000;
/** The longest label a server accepts, in bytes. */
const MAX_LABEL_LEN = 128;

class LockError extends Error {
  constructor(key, message) {
    super(`lock ${key}: ${message}`);
    this.name = this.constructor.name;
    this.key = key;
  }
}
/** A setting that makes no sense, refused before any command is sent; `reason` is the keyword
 * every helper uses (clients/conformance/README.md). */
class LockArgumentError extends Error {
  constructor(reason, message) {
    super(`${reason}: ${message}`);
    this.name = 'LockArgumentError';
    this.reason = reason;
  }
}
/** Another token holds the lock (after waiting, if asked). Nothing was granted. */
class LockNotAcquired extends LockError {}
/** The grant is gone, or presumed gone (its local lease ran out). */
class LockLost extends LockError {}
/** A request was sent, its reply lost, and retries ran out, or a retry was answered by an error
 * that says nothing about the lost try (-POLICY, -READONLY, -MOVED, -NOREPLICAS ...): it may or
 * may not be granted. */
class LockUnknown extends LockError {}
/** No connection could be opened before anything was sent: nothing was granted. */
class LockConnectionError extends LockError {}
/** The server's lock namespaces refused the request (`-POLICY <namespace>: <detail>`):
 * nothing was changed. Never retried: the same request breaks the same rule. `cause` is
 * ioredis' ReplyError, its `command.args` without the token (`withoutToken`). */
class LockPolicyError extends LockError {
  constructor(key, namespace, detail, cause) {
    super(key, `refused by the policy of namespace ${namespace}: ${detail}`);
    this.namespace = namespace;
    this.detail = detail;
    this.cause = cause;
  }
}

/** LockPolicyError for a -POLICY reply, else null. */
function policyError(key, error) {
  const message = String(error && error.message);
  if (!(error && error.name === 'ReplyError') || !message.startsWith('POLICY ')) return null;
  const rest = message.slice('POLICY '.length);
  const at = rest.indexOf(': ');
  return at < 0 ? new LockPolicyError(key, rest, '', error)
    : new LockPolicyError(key, rest.slice(0, at), rest.slice(at + 2), error);
}

/** ioredis puts the command's words on the errors it rejects a command with
 * (`error.command.args`: a ReplyError, an AbortError), the token among them, and util.inspect,
 * console.error and JSON.stringify (what structured loggers do) print them. A token is a
 * secret (the module's README, "Tokens stay secret"): every error the helper throws or keeps
 * has it replaced by `<token>` (also in a cluster error's `lastNodeError` and in `cause`). */
function withoutToken(error, token, depth = 0) {
  if (error === null || typeof error !== 'object' || depth > 2) return error;
  const command = error.command;
  if (command && Array.isArray(command.args)) {
    error.command = { ...command, args: command.args.map((arg) => (String(arg) === token ? '<token>' : arg)) };
  }
  for (const inner of [error.lastNodeError, error.cause]) {
    if (inner !== error) withoutToken(inner, token, depth + 1);
  }
  return error;
}

/** Whether `error` answers a renewal the server applied but could not confirm: SYNC's
 * `NOREPLICAS the change was not acknowledged ...: a failover may lose it` or FSYNC's `ERR the
 * change was not fsynced to the AOF ...`. The lock is still held; only the lease it had before
 * can be counted on. */
function isUnconfirmed(error) {
  const message = String(error && error.message);
  return Boolean(error && error.name === 'ReplyError') &&
    (message.startsWith('NOREPLICAS ') || message.startsWith('ERR the change was not fsynced'));
}

/** Why a lock is lost when LOCK.RENEW answers 0. */
const NOT_HELD = 'LOCK.RENEW replied 0: the token no longer holds it';

/** Errors worth sending the same request again for (with the same token): the server's "try
 * again" replies (the key moved with its slot, the cluster is failing over, the node became a
 * replica or is loading) and lost connections. Not MOVED/ASK (ioredis' Cluster follows them;
 * a standalone client cannot) nor READONLY (a resend on the same connection reaches the same
 * replica; ioredis' `reconnectOnError` is the tool for that). */
function isRetriable(error) {
  const message = String(error && error.message);
  return /^(TRYAGAIN|CLUSTERDOWN|UNBLOCKED|LOADING|MASTERDOWN)/.test(message) ||
    isConnectionError(error);
}

/** The connection failed: the command may or may not have run. ioredis rejects a command with
 * MaxRetriesPerRequestError when its reconnects ran out, also one it had sent before the
 * connection broke (it keeps those to resend). */
function isConnectionError(error) {
  const message = String(error && error.message);
  return ['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT'].includes(error && error.code) ||
    (error && error.name === 'MaxRetriesPerRequestError') ||
    /Connection is closed|Stream isn't writeable|connect ECONNREFUSED|Command timed out/.test(message);
}

/** Nothing could have been sent: the connection was never there. */
function notConnected(error) {
  const message = String(error && error.message);
  return (error && error.code === 'ECONNREFUSED') || /Stream isn't writeable|ECONNREFUSED/.test(message);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** How to retry TRYAGAIN, CLUSTERDOWN, UNBLOCKED, LOADING, MASTERDOWN and lost connections:
 * `attempts` in all (the first included); the n-th retry waits a random time between half and
 * all of min(capMs, baseMs * 2^n); no retry starts later than `deadlineMs` after the first
 * failure. The defaults are the Python and Rust helpers'. */
class RetryPolicy {
  constructor({ attempts = 6, baseMs = 20, capMs = 1000, deadlineMs = 10_000 } = {}) {
    if (!Number.isInteger(attempts) || attempts < 1 || !(deadlineMs > 0) || !(baseMs >= 0) || !(capMs >= 0)) {
      throw new LockArgumentError('retry', 'a retry policy needs at least 1 attempt, non-negative delays and a positive deadline');
    }
    Object.assign(this, { attempts, baseMs, capMs, deadlineMs });
  }

  /** The pause before retry number `retry` (from 1), in ms. */
  delay(retry) {
    return Math.min(this.capMs, this.baseMs * 2 ** retry) * (0.5 + Math.random() / 2);
  }

  /** The pause before retry number `retry`, or null when the attempts or the deadline (a time
   * from performance.now(), set at the first failure) are used up. */
  _pause(retry, giveUpAt) {
    const pause = this.delay(retry);
    return retry >= this.attempts || performance.now() + pause >= giveUpAt ? null : pause;
  }
}

/** A SYNC or FSYNC timeout the server takes: 1 to 2^45 ms. */
function validTimeout(ms) {
  return Number.isInteger(ms) && ms >= 1 && ms <= MAX_WAIT_MS;
}

function validLabel(label) {
  return typeof label === 'string' && label.length >= 1 && label.length <= MAX_LABEL_LEN &&
    /^[!-~]+$/.test(label);
}

class Lock {
  /**
   * One lock key, taken by one holder at a time with a fresh random token per grant.
   * `redis` is an ioredis client. A waiting acquire blocks that client's connection: give
   * waiting locks a client of their own.
   */
  constructor(redis, key, {
    ttlMs, waitMs, shared = false, limit, label, watchdog = false, onLost,
    retry = new RetryPolicy(), sync, fsyncMs,
  } = {}) {
    if (!Number.isInteger(ttlMs) || ttlMs < 1 || ttlMs > MAX_TTL_MS) {
      throw new LockArgumentError('ttl', `ttlMs must be an integer from 1 to ${MAX_TTL_MS} (one year), in ms`);
    }
    if (waitMs !== undefined && (!Number.isInteger(waitMs) || waitMs < 0 || waitMs > MAX_WAIT_MS)) {
      throw new LockArgumentError('wait', `waitMs must be undefined (do not wait) or 0 (no limit) to ${MAX_WAIT_MS}`);
    }
    if (limit !== undefined && (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT)) {
      throw new LockArgumentError('limit', `limit must be undefined or 1 to ${MAX_LIMIT}`);
    }
    if (shared && limit !== undefined) {
      throw new LockArgumentError('shared+limit', 'shared and limit together are ambiguous: a permit is already a shared hold; ask for one of them');
    }
    if (watchdog && ttlMs < 3) {
      throw new LockArgumentError('watchdog-ttl', 'a watchdog renews every ttlMs / 3: ttlMs must be at least 3');
    }
    if (!(retry instanceof RetryPolicy)) {
      throw new LockArgumentError('retry', 'retry must be a RetryPolicy');
    }
    if (label !== undefined && !validLabel(label)) {
      throw new LockArgumentError('label', 'a label is 1 to 128 bytes of printable ASCII without spaces');
    }
    if (sync !== undefined && !(sync !== null && typeof sync === 'object' && !Array.isArray(sync) &&
        Number.isInteger(sync.replicas) && sync.replicas >= 0 && validTimeout(sync.timeoutMs))) {
      throw new LockArgumentError('sync', `sync must be undefined or { replicas >= 0, timeoutMs from 1 to ${MAX_WAIT_MS} }`);
    }
    if (fsyncMs !== undefined && !validTimeout(fsyncMs)) {
      throw new LockArgumentError('fsync', `fsyncMs must be undefined or a timeout from 1 to ${MAX_WAIT_MS} ms`);
    }
    if (sync !== undefined) sync = { replicas: sync.replicas, timeoutMs: sync.timeoutMs };
    Object.assign(this, { redis, key, ttlMs, waitMs, shared, limit, label, watchdog, onLost, retry, sync, fsyncMs });
    // The local lease: allow 1% + 2 ms for the server's rounding and clock rate.
    this._leaseMs = Math.max(0, ttlMs * 0.99 - 2);
    this._token = null;
    this._fence = null;
    this._leaseEnd = 0;
    this._lostReason = null;
    this._lossReported = false;
    this._timer = null;
    this._renewing = null; // the renewal in flight, awaited by release()
    this._refused = null; // a renewal's -POLICY refusal, for renew() to throw
    this._stopping = false;
    // Test seam: awaited by the watchdog with the round's number (from 0) between its timer
    // and its renewal; a promise that stays pending is a stalled watchdog.
    this._beforeRenewal = null;
  }

  /** The fence of the current grant (null before the first). */
  get fence() {
    return this._fence;
  }

  /** True once the grant is known or presumed gone, as soon as the local lease has run out. */
  get lost() {
    this._lapsed();
    this._reportLoss();
    return this._lostReason !== null;
  }

  /** Granted, not released, not lost. */
  get held() {
    return this._token !== null && !this.lost;
  }

  /** The fence, or LockLost when the lock is no longer held. */
  check() {
    if (this._token === null) throw new LockError(this.key, 'not held: acquire it first');
    if (this.lost) throw new LockLost(this.key, `lost: ${this._lostReason}`);
    return this._fence;
  }

  /** Take the lock and return its fence (see the README for the errors). */
  async acquire() {
    if (this._token !== null) throw new LockError(this.key, 'already acquired by this Lock: release it first');
    const token = crypto.randomBytes(16).toString('hex');
    const base = ['LOCK.ACQUIRE', this.key, token, this.ttlMs];
    if (this.shared) base.push('SHARED');
    if (this.limit !== undefined) base.push('LIMIT', this.limit);
    if (this.label !== undefined) base.push('LABEL', this.label);
    base.push(...this._durability());
    const waitsUntil = this.waitMs ? Date.now() + this.waitMs : null;
    let retries = 0;
    let maybeGranted = false;
    let giveUpAt = null;
    for (;;) {
      const command = base.slice();
      if (this.waitMs === 0) {
        command.push('WAIT', 0);
      } else if (waitsUntil !== null) {
        const left = Math.ceil(waitsUntil - Date.now());
        if (left >= 1) command.push('WAIT', left);
      }
      const sent = performance.now();
      let reply;
      try {
        reply = await this._send(token, ...command);
      } catch (error) {
        if (!isRetriable(error)) {
          if (maybeGranted) {
            // An earlier try whose reply was lost may have been granted: an answer that is not
            // retried (-POLICY: the policy changed since; -READONLY, -MOVED: this retry reached
            // another node; -NOREPLICAS: the token's grant stands, unconfirmed) says nothing
            // about that try.
            await this._forget(token);
            throw new LockUnknown(this.key, `a retry was answered (${error.message}) after a try whose reply was lost`);
          }
          throw policyError(this.key, error) ?? error;
        }
        if (notConnected(error) && !maybeGranted) {
          throw new LockConnectionError(this.key, `could not connect, nothing was sent (${error.message})`);
        }
        maybeGranted = maybeGranted || isConnectionError(error);
        retries += 1;
        giveUpAt = giveUpAt ?? performance.now() + this.retry.deadlineMs;
        const pause = this.retry._pause(retries, giveUpAt);
        if (pause === null) {
          // The grant may exist: release what this token may hold (once, best effort).
          await this._forget(token);
          throw new LockUnknown(this.key, `no answer after ${retries} attempts (${error.message})`);
        }
        await sleep(pause);
        continue;
      }
      if (reply === null) throw new LockNotAcquired(this.key, 'held by another token');
      this._token = token;
      this._fence = Number(reply);
      this._leaseEnd = sent + this._leaseMs;
      this._lostReason = null;
      this._lossReported = false;
      this._refused = null;
      this._stopping = false;
      if (performance.now() - sent > this.ttlMs / 10) {
        // Granted at an unknown moment of a long wait: a renewal sets a lease whose start is known.
        let reason;
        try {
          reason = await this._renewOnce(token, false);
        } catch (error) {
          // Renewed but unconfirmed: the lease it can count on is the grant's, whose start is
          // not known. Given back, as after any other failed renewal here.
          this._token = null;
          await this._forget(token);
          throw new LockUnknown(this.key, `granted, but the renewal that anchors the lease: ${error.message}`);
        }
        if (reason !== null) {
          // Never handed out: not a loss to report.
          this._token = null;
          this._lostReason = null;
          const refused = this._refused;
          this._refused = null;
          if (reason === NOT_HELD) throw new LockNotAcquired(this.key, `granted, but ${reason}`);
          // Refused or failed: the grant may stand until its lease ends. Give it back, so that
          // a refusal leaves nothing changed, as its error says.
          await this._forget(token);
          if (refused) throw refused;
          throw new LockUnknown(this.key, `granted, but ${reason}`);
        }
      }
      if (this.watchdog) this._schedule(token);
      return this._fence;
    }
  }

  /** Renew now (the lease ends ttlMs from now); LockLost when no longer held (also when any
   * reply, an unconfirmed one included, came after the local lease ran out), LockPolicyError
   * when the server's policy refused the renewal (the lock then counts as lost, as the
   * watchdog counts it), ioredis' ReplyError (without the token) when the server renewed in
   * time but could not confirm it (`NOREPLICAS the change was not acknowledged ...`, `ERR the
   * change was not fsynced ...`): the lock is still held, on the local lease it had before. */
  async renew() {
    const token = this._token;
    if (token === null) throw new LockError(this.key, 'not held: acquire it first');
    // Lost before this call (the watchdog's refusal, say): nothing is sent, and the answer is
    // LockLost, not a refusal this call did not get.
    const lostBefore = this._lostReason !== null;
    const reason = await this._renewOnce(token, true);
    if (reason !== null) {
      this._reportLoss();
      const refused = lostBefore ? null : this._refused;
      this._refused = null;
      if (refused) throw refused;
      throw new LockLost(this.key, `lost: ${reason}`);
    }
  }

  /** Stop the watchdog (no renewal is sent after this returns), then release with the token,
   * retried as acquire is. True when the server released this grant; false when it was not
   * held any more (or an earlier try whose reply was lost released it). LockConnectionError
   * when nothing could be sent, LockUnknown when the retries ran out. */
  async release() {
    const token = this._token;
    if (token === null) return false;
    this._lapsed();
    this._stopping = true;
    clearTimeout(this._timer);
    this._timer = null;
    if (this._renewing) await this._renewing.catch(() => {});
    this._token = null;
    this._leaseEnd = 0;
    try {
      const [reply, retried] = await this._call(token, 'LOCK.RELEASE', this.key, token);
      // A 0 after a retry may answer our own earlier release, whose reply was lost.
      if (reply !== 1 && !retried) this._markLost('LOCK.RELEASE found the token no longer holding the lock');
      return reply === 1;
    } finally {
      this._reportLoss();
    }
  }

  /** Run `work(fence)` if the lock is still held (LockLost otherwise). */
  async fenced(work) {
    return work(this.check());
  }

  /** Run one Redis command only while this grant's fence is current (LOCK.GUARD); LockLost
   * when it is not (the command did not run). Not retried. */
  async guarded(...command) {
    const fence = this.check();
    try {
      return await this.redis.call('LOCK.GUARD', this.key, fence, ...command);
    } catch (error) {
      if (!String(error.message).startsWith('FENCED')) throw error;
      const reason = this._markLost('LOCK.GUARD says the fence is no longer current');
      this._reportLoss();
      throw new LockLost(this.key, `lost: ${reason}`);
    }
  }

  /** Acquire, run `body(fence)`, release (also when it throws). The body never runs without
   * the lock. */
  async run(body) {
    const fence = await this.acquire();
    try {
      return await body(fence);
    } finally {
      await this.release();
    }
  }

  // ---- internals ----------------------------------------------------------------------------

  _schedule(token, round = 0, delayMs = this.ttlMs / 3) {
    if (this._stopping) return;
    this._timer = setTimeout(() => {
      this._timer = null;
      this._renewing = (async () => {
        // Tests pause the watchdog here, between its timer and its renewal.
        if (this._beforeRenewal) await this._beforeRenewal(round);
        return this._renewOnce(token, true);
      })().then((reason) => {
        this._renewing = null;
        if (reason !== null) this._reportLoss();
        else this._schedule(token, round + 1);
      }, (error) => {
        this._renewing = null;
        if (!isUnconfirmed(error)) throw error;
        // Renewed, unconfirmed (NOREPLICAS, FSYNC): held on the old lease. Renew again within
        // it (half of what is left, at most a third of the ttl), as the Rust helper does; past
        // it the next round finds the lease over.
        const left = this._leaseEnd - performance.now();
        this._schedule(token, round + 1, Math.max(0, Math.min(left / 2, this.ttlMs / 3)));
      });
    }, delayMs);
    this._timer.unref?.();
  }

  /** One command carrying `token`, retried as acquire is: [reply, whether it was sent more than
   * once]. */
  async _call(token, ...command) {
    let retries = 0;
    let maybeSent = false;
    let giveUpAt = null;
    for (;;) {
      try {
        return [await this._send(token, ...command), retries > 0];
      } catch (error) {
        if (!isRetriable(error)) throw error;
        if (notConnected(error) && !maybeSent) {
          throw new LockConnectionError(this.key, `could not connect, ${command[0]} was not sent (${error.message})`);
        }
        maybeSent = maybeSent || isConnectionError(error);
        retries += 1;
        giveUpAt = giveUpAt ?? performance.now() + this.retry.deadlineMs;
        const pause = this.retry._pause(retries, giveUpAt);
        if (pause === null) {
          throw new LockUnknown(this.key, `no answer to ${command[0]} after ${retries} attempts (${error.message})`);
        }
        await sleep(pause);
      }
    }
  }

  /** One renewal; the reason the lock is lost, or null when renewed. Throws the server's
   * error when the renewal was applied but not confirmed (isUnconfirmed) and answered before
   * the local lease ran out: the lock is still held and the local lease is left as it was. Any
   * reply after the local lease ran out, unconfirmed or not, is a loss. `anchored`: never send once the local lease
   * has ended (a late renewal could extend a lease the server ended). */
  async _renewOnce(token, anchored) {
    if (this._lostReason !== null) return this._lostReason;
    for (let retries = 0; ; retries += 1) {
      if (this._stopping && anchored) return null;
      const sent = performance.now();
      if (anchored && sent >= this._leaseEnd) return this._markLost('the lease ran out before the renewal was sent');
      let reply;
      try {
        reply = await this._send(token, 'LOCK.RENEW', this.key, token, this.ttlMs, ...this._durability());
      } catch (error) {
        const refused = policyError(this.key, error);
        if (refused) {
          // The same renewal breaks the same rule every time: the lease cannot be kept as
          // asked, so the lock counts as lost now, as after a 0.
          this._refused = refused;
          return this._markLost(`renewal refused: ${error.message}`);
        }
        // Too late, whatever it says: the lease may have ended in between.
        if (anchored && performance.now() >= this._leaseEnd) return this._markLost('the renewal was answered after the lease ran out');
        // Renewed on the primary, not confirmed: still held, on the old lease.
        if (isUnconfirmed(error)) throw error;
        if (!isRetriable(error) || retries + 1 >= this.retry.attempts) return this._markLost(`renewal failed: ${error.message}`);
        await sleep(this.retry.delay(retries + 1));
        continue;
      }
      if (anchored && performance.now() >= this._leaseEnd) return this._markLost('the renewal was answered after the lease ran out');
      if (reply !== 1) return this._markLost(NOT_HELD);
      this._leaseEnd = sent + this._leaseMs;
      return null;
    }
  }

  /** After an acquire that may have been granted: one LOCK.RELEASE with the token, best
   * effort (the lease ends the grant otherwise). */
  async _forget(token) {
    await this._send(token, 'LOCK.RELEASE', this.key, token).catch(() => {});
  }

  /** `redis.call(...command)` for a command carrying `token`: whatever it rejects with comes
   * without the token (withoutToken). */
  async _send(token, ...command) {
    try {
      return await this.redis.call(...command);
    } catch (error) {
      throw withoutToken(error, token);
    }
  }

  /** SYNC numreplicas timeout-ms and FSYNC timeout-ms, as asked. */
  _durability() {
    const words = [];
    if (this.sync !== undefined) words.push('SYNC', this.sync.replicas, this.sync.timeoutMs);
    if (this.fsyncMs !== undefined) words.push('FSYNC', this.fsyncMs);
    return words;
  }

  _markLost(reason) {
    if (this._lostReason === null) this._lostReason = reason;
    return this._lostReason;
  }

  _lapsed() {
    if (this._token !== null && this._lostReason === null && performance.now() >= this._leaseEnd) {
      this._markLost('the lease ran out');
    }
  }

  _reportLoss() {
    if (this._lostReason === null || this._lossReported) return;
    this._lossReported = true;
    clearTimeout(this._timer);
    this._timer = null;
    if (this.onLost) {
      try {
        this.onLost(this);
      } catch {
        // A callback's failure is its own.
      }
    }
  }
}

module.exports = {
  Lock, RetryPolicy, LockError, LockArgumentError, LockNotAcquired, LockLost, LockUnknown,
  LockConnectionError, LockPolicyError, isRetriable, MAX_TTL_MS, MAX_WAIT_MS, MAX_LIMIT, MAX_LABEL_LEN,
};
