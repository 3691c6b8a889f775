//! A Redis Cluster of test servers on loopback: primaries sharing the 16384 slots, a replica each,
//! every node with the module loaded; slot migration done as `redis-cli --cluster` does it
//! (SETSLOT IMPORTING / MIGRATING, MIGRATE, SETSLOT NODE). Every node is stopped with the
//! cluster.

use super::*;

pub use slots::SLOTS;

/// The module's own slot function (a pure file, shared rather than written twice); the tests
/// check it against the servers' routing.
#[allow(dead_code)]
#[path = "../../src/lock/slots.rs"]
mod slots;

/// The slot of `key`, hash tags included (`{order:42}:lock` hashes `order:42`).
pub fn key_slot(key: &str) -> u16 {
    slots::key_slot(key.as_bytes())
}

pub fn cluster_config() -> Config {
    let mut config = Config::default()
        .with("cluster-node-timeout", "1000")
        .with("appendonly", "no");
    config.cluster = true;
    config
}

pub struct Cluster {
    /// Primaries first (`primaries` of them), then one replica of each, in the same order.
    pub nodes: Vec<Server>,
    pub ids: Vec<String>,
    pub primaries: usize,
}

impl Cluster {
    /// `primaries` primaries splitting the slots evenly, each with `with_replicas` replica.
    pub fn start(primaries: usize, with_replicas: bool) -> Cluster {
        Cluster::start_with(primaries, with_replicas, cluster_config())
    }

    pub fn start_with(primaries: usize, with_replicas: bool, config: Config) -> Cluster {
        let count = if with_replicas {
            2 * primaries
        } else {
            primaries
        };
        let nodes: Vec<Server> = (0..count)
            .map(|_| Server::start_with(config.clone()))
            .collect();
        let ids: Vec<String> = nodes
            .iter()
            .map(|n| n.conn().call(&["CLUSTER", "MYID"]).text())
            .collect();
        let per = SLOTS as usize / primaries;
        for (i, node) in nodes.iter().take(primaries).enumerate() {
            let first = i * per;
            let last = if i + 1 == primaries {
                SLOTS as usize - 1
            } else {
                first + per - 1
            };
            let reply = node.conn().call(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &first.to_string(),
                &last.to_string(),
            ]);
            assert_eq!(reply, Reply::status("OK"));
        }
        let mut first = nodes[0].conn();
        for node in &nodes[1..] {
            let reply = first.call(&[
                "CLUSTER",
                "MEET",
                "127.0.0.1",
                &node.port.to_string(),
                &node.bus_port.to_string(),
            ]);
            assert_eq!(reply, Reply::status("OK"));
        }
        let cluster = Cluster {
            nodes,
            ids,
            primaries,
        };
        cluster.wait_all_known();
        for r in primaries..count {
            let primary = &cluster.ids[r - primaries];
            let reply = cluster.nodes[r]
                .conn()
                .call(&["CLUSTER", "REPLICATE", primary]);
            assert_eq!(reply, Reply::status("OK"), "node {r}");
        }
        cluster.wait_ok();
        for r in primaries..count {
            wait_for("replica link up", || {
                (cluster.nodes[r]
                    .info_field("replication", "master_link_status")
                    .as_deref()
                    == Some("up"))
                .then_some(())
            });
        }
        cluster
    }

    fn wait_all_known(&self) {
        for node in &self.nodes {
            wait_for("every node to know every other", || {
                let nodes = node.conn().call(&["CLUSTER", "NODES"]).text();
                (nodes.lines().filter(|l| !l.contains("handshake")).count() == self.nodes.len())
                    .then_some(())
            });
        }
    }

    /// Waits until every live node says `cluster_state:ok` and agrees on who serves every slot.
    pub fn wait_ok(&self) {
        wait_for("cluster_state:ok everywhere", || {
            let views: Vec<String> = self
                .live()
                .map(|n| {
                    let info = n.conn().call(&["CLUSTER", "INFO"]).text();
                    if info.contains("cluster_state:ok") {
                        self.slot_map_of(n)
                    } else {
                        String::new()
                    }
                })
                .collect();
            (!views[0].is_empty() && views.iter().all(|v| *v == views[0])).then_some(())
        });
    }

    /// The nodes still running.
    pub fn live(&self) -> impl Iterator<Item = &Server> {
        self.nodes.iter().filter(|n| n.is_running())
    }

    /// A node's view of which port serves which slot range, as text (for comparing views).
    fn slot_map_of(&self, node: &Server) -> String {
        let slots = node.conn().call(&["CLUSTER", "SLOTS"]);
        let mut ranges: Vec<String> = slots
            .items()
            .iter()
            .map(|r| {
                let r = r.items();
                format!("{}-{}:{}", r[0].int(), r[1].int(), r[2].items()[1].int())
            })
            .collect();
        ranges.sort();
        ranges.join(",")
    }

    /// The index of the node that serves `slot` now, as the first live node sees it.
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        let node = self.live().next().expect("a live node");
        let slots = node.conn().call(&["CLUSTER", "SLOTS"]);
        let port = slots
            .items()
            .iter()
            .find_map(|r| {
                let r = r.items();
                (r[0].int() <= i64::from(slot) && i64::from(slot) <= r[1].int())
                    .then(|| r[2].items()[1].int())
            })
            .unwrap_or_else(|| panic!("nobody serves slot {slot}"));
        self.index_of_port(port as u16)
    }

    pub fn owner_of(&self, key: &str) -> usize {
        self.owner_of_slot(key_slot(key))
    }

    pub fn index_of_port(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// A connection to the node serving `key`.
    pub fn conn_for(&self, key: &str) -> Conn {
        self.nodes[self.owner_of(key)].conn()
    }

    /// The replica of primary `primary` (by index), as started.
    pub fn replica_of(&self, primary: usize) -> usize {
        primary + self.primaries
    }

    /// Starts moving `slot` from node `from` to node `to`: `to` imports it, `from` migrates it.
    pub fn begin_migration(&self, slot: u16, from: usize, to: usize) {
        let slot = slot.to_string();
        let reply = self.nodes[to].conn().call(&[
            "CLUSTER",
            "SETSLOT",
            &slot,
            "IMPORTING",
            &self.ids[from],
        ]);
        assert_eq!(reply, Reply::status("OK"));
        let reply = self.nodes[from].conn().call(&[
            "CLUSTER",
            "SETSLOT",
            &slot,
            "MIGRATING",
            &self.ids[to],
        ]);
        assert_eq!(reply, Reply::status("OK"));
    }

    /// Moves every key of `slot` from `from` to `to` with MIGRATE.
    pub fn move_keys(&self, slot: u16, from: usize, to: usize) {
        let mut c = self.nodes[from].conn();
        loop {
            let keys = c.call(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"]);
            let keys: Vec<String> = keys.items().iter().map(Reply::text).collect();
            if keys.is_empty() {
                return;
            }
            let port = self.nodes[to].port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            assert_eq!(c.call(&args), Reply::status("OK"));
        }
    }

    /// Ends the move of `slot`: `to` owns it, and every primary is told.
    pub fn end_migration(&self, slot: u16, to: usize) {
        let slot = slot.to_string();
        let order = std::iter::once(to).chain((0..self.nodes.len()).filter(|i| *i != to));
        for i in order {
            // Replicas learn it from their primaries (SETSLOT is for primaries only).
            if !self.nodes[i].is_running()
                || self.nodes[i].info_field("replication", "role").as_deref() != Some("master")
            {
                continue;
            }
            let reply =
                self.nodes[i]
                    .conn()
                    .call(&["CLUSTER", "SETSLOT", &slot, "NODE", &self.ids[to]]);
            assert_eq!(reply, Reply::status("OK"), "node {i}");
        }
        self.wait_ok();
    }

    /// The whole move of `slot`, as `redis-cli --cluster reshard` makes it.
    pub fn migrate_slot(&self, slot: u16, from: usize, to: usize) {
        self.begin_migration(slot, from, to);
        self.move_keys(slot, from, to);
        self.end_migration(slot, to);
    }

    /// The states of the atomic slot migrations node `node` knows (`CLUSTER GETSLOTMIGRATIONS`:
    /// those in progress and the recent finished ones).
    pub fn slot_migration_states(&self, node: usize) -> Vec<String> {
        let jobs = self.nodes[node]
            .conn()
            .call(&["CLUSTER", "GETSLOTMIGRATIONS"]);
        jobs.items()
            .iter()
            .filter_map(|job| {
                let fields = job.items();
                let at = fields.iter().position(|f| *f == Reply::bulk("state"))?;
                Some(fields[at + 1].text())
            })
            .collect()
    }

    /// Starts moving `slot` from `from` to `to` by atomic slot migration (it goes on in the
    /// background: see `CLUSTER GETSLOTMIGRATIONS`).
    pub fn start_atomic_migration(&self, slot: u16, from: usize, to: usize) {
        let slot = slot.to_string();
        let reply = self.nodes[from].conn().call(&[
            "CLUSTER",
            "MIGRATESLOTS",
            "SLOTSRANGE",
            &slot,
            &slot,
            "NODE",
            &self.ids[to],
        ]);
        assert_eq!(reply, Reply::status("OK"), "slot {slot}");
    }

    /// Moves `slot` from `from` to `to` by atomic slot migration (Valkey 9's
    /// `CLUSTER MIGRATESLOTS`) and waits until it succeeded; panics if it failed.
    pub fn migrate_slot_atomically(&self, slot: u16, from: usize, to: usize) {
        let count = |state: &str| {
            self.slot_migration_states(from)
                .iter()
                .filter(|s| *s == state)
                .count()
        };
        let (succeeded, failed) = (count("success"), count("failed") + count("cancelled"));
        self.start_atomic_migration(slot, from, to);
        wait_for("the atomic slot migration to succeed", || {
            assert_eq!(
                count("failed") + count("cancelled"),
                failed,
                "slot {slot}: {:?}",
                self.slot_migration_states(from)
            );
            (count("success") > succeeded).then_some(())
        });
        self.wait_ok();
    }
}
