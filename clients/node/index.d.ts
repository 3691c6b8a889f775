// Types of redis-lock-client (clients/node/index.js).
import type { Redis, Cluster } from 'ioredis';

export declare const MAX_TTL_MS: number;
export declare const MAX_WAIT_MS: number;
export declare const MAX_LIMIT: number;
export declare const MAX_LABEL_LEN: number;

export declare class LockError extends Error {
  readonly key: string;
}
/** A setting that makes no sense, refused before any command is sent. */
export declare class LockArgumentError extends Error {
  /** ttl, watchdog-ttl, wait, limit, shared+limit, retry, label, sync or fsync. */
  readonly reason: string;
}
export declare class LockNotAcquired extends LockError {}
export declare class LockLost extends LockError {}
export declare class LockUnknown extends LockError {}
export declare class LockConnectionError extends LockError {}
/** The server's lock namespaces refused the request (`-POLICY <namespace>: <detail>`): nothing
 * was changed. Never retried. */
export declare class LockPolicyError extends LockError {
  /** The namespace whose rule was broken, e.g. `orders`. */
  readonly namespace: string;
  /** The rule broken, in the server's words, e.g. `a LABEL is required`. */
  readonly detail: string;
  /** ioredis' ReplyError, its `command.args` without the token. */
  readonly cause: Error;
}

export interface RetryOptions {
  /** Attempts in all, the first included (default 6). */
  attempts?: number;
  /** The n-th retry waits between half and all of min(capMs, baseMs * 2^n) (default 20). */
  baseMs?: number;
  /** Longest pause (default 1000). */
  capMs?: number;
  /** No retry starts later than this after the first failure (default 10000). */
  deadlineMs?: number;
}
/** How to retry TRYAGAIN, CLUSTERDOWN, UNBLOCKED, LOADING, MASTERDOWN and lost connections,
 * always with the same token. */
export declare class RetryPolicy {
  constructor(options?: RetryOptions);
  readonly attempts: number;
  readonly baseMs: number;
  readonly capMs: number;
  readonly deadlineMs: number;
  /** The pause before retry number `retry` (from 1), in ms. */
  delay(retry: number): number;
}

/** Whether the helper sends a command again (same token) after this error: the server's
 * TRYAGAIN, CLUSTERDOWN, UNBLOCKED, LOADING, MASTERDOWN, and lost connections. */
export declare function isRetriable(error: unknown): boolean;

export interface LockOptions {
  /** The lease, in ms (1 to one year). */
  ttlMs: number;
  /** Wait on the server: undefined: no; 0: without limit; n: up to n ms. */
  waitMs?: number;
  shared?: boolean;
  /** A permit of a semaphore of `limit` permits. */
  limit?: number;
  /** A public label for operators (LOCK.WHO): printable ASCII without spaces, up to 128. */
  label?: string;
  /** Renew every ttlMs / 3 while held. */
  watchdog?: boolean;
  /** Called once when the grant is lost. */
  onLost?: (lock: Lock) => void;
  retry?: RetryPolicy;
  /** `SYNC replicas timeoutMs` on every LOCK.ACQUIRE and LOCK.RENEW: the reply waits until
   * that many replicas acknowledged the change (NOREPLICAS ... otherwise). An integer
   * `replicas >= 0` and an integer `timeoutMs` from 1 to 2^45, else LockArgumentError `sync`. */
  sync?: { replicas: number; timeoutMs: number };
  /** `FSYNC fsyncMs` on every LOCK.ACQUIRE and LOCK.RENEW: the reply waits until the change is
   * fsynced to the server's AOF (`ERR FSYNC needs appendonly yes` without one). An integer
   * from 1 to 2^45, else LockArgumentError `fsync`. */
  fsyncMs?: number;
}

export declare class Lock {
  constructor(redis: Redis | Cluster, key: string, options: LockOptions);
  readonly key: string;
  readonly fence: number | null;
  readonly lost: boolean;
  readonly held: boolean;
  check(): number;
  /** The fence; LockNotAcquired, LockConnectionError (nothing sent), LockPolicyError (the
   * server's policy refused it, at once) or LockUnknown (a reply lost and the retries used up,
   * or a retry after a lost reply answered by an error that is not retried; one LOCK.RELEASE
   * with the token was tried). */
  acquire(): Promise<number>;
  /** LockLost when no longer held (or any reply came after the local lease ran out);
   * LockPolicyError when the server's policy refused the renewal (the lock then counts as
   * lost); ioredis' ReplyError when the server renewed in time but could not confirm it
   * (NOREPLICAS, the FSYNC change error): still held, on the old lease. */
  renew(): Promise<void>;
  /** Stops the watchdog, then releases with the token (retried as acquire is): true when this
   * grant was released, false when it was not held any more. */
  release(): Promise<boolean>;
  fenced<T>(work: (fence: number) => T | Promise<T>): Promise<T>;
  guarded(...command: (string | number | Buffer)[]): Promise<unknown>;
  run<T>(body: (fence: number) => T | Promise<T>): Promise<T>;
}
