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

async function waitFor(what, check, patienceMs = 10_000) {
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

module.exports = { Server, waitFor };
