'use strict';
// A redis-server with the lock module on a free loopback port, in a temporary directory; the
// test that starts it stops it. $REDIS_SERVER (default redis-server) and $LOCK_MODULE (default:
// the repository's debug build).
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const Redis = require('ioredis');

const ROOT = path.resolve(__dirname, '../../..');
const PATIENCE_MS = 10_000;

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

async function waitFor(what, check, patienceMs = PATIENCE_MS) {
  const deadline = Date.now() + patienceMs;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== null && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

class Server {
  static async start(...extra) {
    const server = new Server();
    server.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lock-node-'));
    server.port = await freePort();
    const module = process.env.LOCK_MODULE || path.join(ROOT, 'target/debug/libredis_lock.so');
    server.process = spawn(process.env.REDIS_SERVER || 'redis-server', [
      '--port', String(server.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
      '--dir', server.dir, '--loadmodule', module, ...extra,
    ], { stdio: 'ignore' });
    server.admin = server.client();
    // Its first connects are refused until the server listens: the readiness wait's business.
    server.admin.on('error', () => {});
    await waitFor(`redis-server on ${server.port}`, async () => {
      try {
        return (await server.admin.ping()) === 'PONG';
      } catch {
        return false;
      }
    });
    return server;
  }

  client(options = {}) {
    return new Redis({ host: '127.0.0.1', port: this.port, lazyConnect: false, maxRetriesPerRequest: 1, ...options });
  }

  async info(key) {
    const reply = await this.admin.call('LOCK.INFO', key);
    if (reply === null) return null;
    const fields = {};
    for (let i = 0; i < reply.length; i += 2) fields[reply[i]] = reply[i + 1];
    return fields;
  }

  async calls(command) {
    const info = await this.admin.info('commandstats');
    const match = info.match(new RegExp(`cmdstat_${command}:calls=(\\d+)`));
    return match ? Number(match[1]) : 0;
  }

  async stop() {
    this.admin.disconnect();
    if (this.process.exitCode === null) {
      const exited = new Promise((resolve) => this.process.once('exit', resolve));
      this.process.kill('SIGKILL');
      await exited;
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * A client wrapper between a helper and its ioredis client (the helper only uses `call`), the
 * faults of clients/conformance/README.md: it records every command the helper sends (`sent`)
 * and, on the nth command of a name, `drop-reply` (the server runs it, the helper gets the
 * error ioredis gives a command whose connection closed: "Connection is closed.") or
 * `reply-error` (not sent; the helper gets ioredis' ReplyError with that text). `faults` are
 * `{ at, nth: n | [n, ...] | 'every', fault, error }`; commands count per name, from 1.
 */
class Faults {
  constructor(client, faults = []) {
    this.client = client;
    this.faults = faults.filter((f) => f.at !== 'watchdog');
    this.sent = [];
  }

  count(name) {
    return this.sent.filter((args) => String(args[0]).toUpperCase() === name.toUpperCase()).length;
  }

  async call(...args) {
    const name = String(args[0]).toUpperCase();
    this.sent.push(args);
    const n = this.count(name);
    const fault = this.faults.find((f) => f.at.toUpperCase() === name &&
      (f.nth === 'every' || f.nth === n || (Array.isArray(f.nth) && f.nth.includes(n))));
    if (!fault) return this.client.call(...args);
    if (fault.fault === 'reply-error') throw new Redis.ReplyError(fault.error);
    if (fault.fault === 'drop-reply') {
      await this.client.call(...args);
      throw new Error('Connection is closed.');
    }
    throw new Error(`unknown fault ${fault.fault}`);
  }
}

/** A watchdog pause (`lock._beforeRenewal = pause.hook()`): the watchdog stops at one renewal
 * round (from 0), between its timer and its renewal, until go(); bounded, so a failing test
 * never hangs. */
class Pause {
  constructor(round = 0) {
    this.round = round;
    this.reached = false;
    this._released = new Promise((resolve) => { this._go = resolve; });
  }

  hook() {
    return async (round) => {
      if (round !== this.round) return;
      this.reached = true;
      let timer;
      const bound = new Promise((resolve) => { timer = setTimeout(resolve, PATIENCE_MS * 3); });
      await Promise.race([this._released, bound]);
      clearTimeout(timer);
    };
  }

  waitReached() {
    return waitFor('the watchdog to reach its pause', () => this.reached);
  }

  go() {
    this._go();
  }
}

/** Cluster-enabled primaries with the module (three by default), the slots split among them;
 * `stop()` ends them all. */
class Cluster {
  static async start(count = 3) {
    const cluster = new Cluster();
    cluster.nodes = [];
    try {
      for (let i = 0; i < count; i += 1) {
        // The bus port is picked too: port + 10000 may be taken.
        const bus = await freePort();
        const node = await Server.start('--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf',
          '--cluster-node-timeout', '1000', '--cluster-port', String(bus));
        node.busPort = bus;
        cluster.nodes.push(node);
      }
      const share = Math.floor(16384 / count);
      for (const [i, node] of cluster.nodes.entries()) {
        const last = i === count - 1 ? 16383 : (i + 1) * share - 1;
        await node.admin.call('CLUSTER', 'ADDSLOTSRANGE', i * share, last);
      }
      for (const node of cluster.nodes.slice(1)) {
        await cluster.nodes[0].admin.call('CLUSTER', 'MEET', '127.0.0.1', node.port, node.busPort);
      }
      await waitFor('cluster_state:ok on every node', () => cluster._allOk());
    } catch (error) {
      await cluster.stop();
      throw error;
    }
    return cluster;
  }

  /** An ioredis Cluster client; the caller disconnects it. */
  client(options = {}) {
    return new Redis.Cluster([{ host: '127.0.0.1', port: this.nodes[0].port }], {
      redisOptions: { maxRetriesPerRequest: 1 }, ...options,
    });
  }

  /** Every node says ok, knows every other, and all agree on every slot's owner. */
  async _allOk() {
    const views = [];
    for (const node of this.nodes) {
      const info = await node.admin.call('CLUSTER', 'INFO');
      if (!info.includes('cluster_state:ok') || !info.includes(`cluster_known_nodes:${this.nodes.length}`)) return false;
      const slots = await node.admin.call('CLUSTER', 'SLOTS');
      views.push(JSON.stringify(slots.map(([start, end, master]) => [start, end, master[1]]).sort((a, b) => a[0] - b[0])));
    }
    return views.every((view) => view === views[0]);
  }

  async nodeId(index) {
    return this.nodes[index].admin.call('CLUSTER', 'MYID');
  }

  async _ownerSeen(node, slot) {
    for (const [start, end, master] of await node.admin.call('CLUSTER', 'SLOTS')) {
      if (start <= slot && slot <= end) return master[1];
    }
    return null;
  }

  /** The index of the node that serves `key`. */
  async ownerOf(key) {
    const slot = await this.nodes[0].admin.call('CLUSTER', 'KEYSLOT', key);
    const port = await this._ownerSeen(this.nodes[0], slot);
    return this.nodes.findIndex((node) => node.port === port);
  }

  /** Moves `key`'s slot as redis-cli --cluster does: IMPORTING, MIGRATING, MIGRATE, then
   * SETSLOT NODE everywhere, the new owner first. */
  async migrateKeySlot(key, source, target) {
    const src = this.nodes[source];
    const dst = this.nodes[target];
    const slot = await src.admin.call('CLUSTER', 'KEYSLOT', key);
    await dst.admin.call('CLUSTER', 'SETSLOT', slot, 'IMPORTING', await this.nodeId(source));
    await src.admin.call('CLUSTER', 'SETSLOT', slot, 'MIGRATING', await this.nodeId(target));
    for (;;) {
      const keys = await src.admin.call('CLUSTER', 'GETKEYSINSLOT', slot, 100);
      if (keys.length === 0) break;
      await src.admin.call('MIGRATE', '127.0.0.1', dst.port, '', 0, 5000, 'KEYS', ...keys);
    }
    const targetId = await this.nodeId(target);
    for (const node of [dst, ...this.nodes.filter((n) => n !== dst)]) {
      await node.admin.call('CLUSTER', 'SETSLOT', slot, 'NODE', targetId);
    }
    await waitFor('every node to agree on the slot\'s owner', async () => {
      for (const node of this.nodes) {
        if (await this._ownerSeen(node, slot) !== dst.port) return false;
      }
      return this._allOk();
    });
  }

  async stop() {
    for (const node of this.nodes) await node.stop();
  }
}

module.exports = { Server, Cluster, Faults, Pause, freePort, waitFor, PATIENCE_MS };
