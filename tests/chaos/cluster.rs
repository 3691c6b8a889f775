//! The oracle against a Redis Cluster: six nodes (three primaries with a replica each), clients
//! that follow the cluster's redirects and ask for SYNC 1 on every ACQUIRE and RENEW, and a
//! controller that moves the locks' slots between primaries under load (on Valkey 9 every other
//! move by atomic slot migration) and kills one primary (its replica takes over). Every
//! invariant must hold.

use crate::clients::{fences_now, run_load, standard_load, Shared};
use crate::common::cluster::{key_slot, Cluster};
use crate::common::*;
use crate::report::{report, Report};
use crate::{params, Rng};

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering::Relaxed;
use std::thread::sleep;
use std::time::Instant;

/// The fence each key shows on the node that serves it.
fn cluster_fences(cluster: &Cluster, keys: &[String]) -> HashMap<String, u64> {
    keys.iter()
        .flat_map(|key| {
            let node = &cluster.nodes[cluster.owner_of(key)];
            fences_now(node, std::slice::from_ref(key))
        })
        .collect()
}

fn cluster_chaos() -> Report {
    let p = params();
    let started = Instant::now();
    let mut cluster = Cluster::start(3, true);
    let atomic = cluster.nodes[0].identity().atomic_slot_migration();
    let mut load = standard_load("cc");
    // Three hash tags: three slots, each holding a third of the keys, moved whole.
    load.keys = (0..p.keys)
        .map(|i| format!("{{cc{}}}:{i}", i % 3))
        .collect();
    // A read/write lock and a semaphore too, in slots that move.
    load.keys
        .extend(["{cc0}:rw".to_string(), "{cc1}:sem".to_string()]);
    load.sync_ack = Some(300);
    load.ttl_ms = (100, 1500);
    load.slow_pct = 1;
    load.abandon_pct = 1;
    let slots: BTreeSet<u16> = load.keys.iter().map(|k| key_slot(k)).collect();
    let slots: Vec<u16> = slots.into_iter().collect();
    let mut sh = Shared::new(0, load);
    sh.cluster = cluster.nodes.iter().map(|n| n.port).collect();
    let keys = sh.load.keys.clone();
    let mut rng = Rng(0xC1A5_7E12);
    let mut logs = Vec::new();
    run_load(&sh, || {
        let kill_at = p.faults / 2;
        for round in 0..p.faults {
            sleep(p.phase);
            let before = sh.history.max_fences();
            sh.history.faults.fetch_add(1, Relaxed);
            let slot = *rng.pick(&slots);
            let from = cluster.owner_of_slot(slot);
            if round == kill_at {
                // A primary dies; the cluster promotes its replica.
                let replica = cluster.replica_of(from % cluster.primaries);
                logs.push(cluster.nodes[from].log());
                cluster.nodes[from].kill();
                wait_for("the replica to take over", || {
                    (cluster.nodes[replica]
                        .info_field("replication", "role")
                        .as_deref()
                        == Some("master"))
                    .then_some(())
                });
                cluster.wait_ok();
            } else {
                let primaries: Vec<usize> = (0..cluster.nodes.len())
                    .filter(|i| {
                        *i != from
                            && cluster.nodes[*i].is_running()
                            && cluster.nodes[*i]
                                .info_field("replication", "role")
                                .as_deref()
                                == Some("master")
                    })
                    .collect();
                let to = *rng.pick(&primaries);
                // Where the server has atomic slot migration (Valkey 9), every other move
                // uses it.
                if atomic && round % 2 == 1 {
                    cluster.migrate_slot_atomically(slot, from, to);
                } else {
                    cluster.migrate_slot(slot, from, to);
                }
            }
            let after = cluster_fences(&cluster, &keys);
            sh.history
                .check_i4(&before, &after, &format!("cluster fault #{round}"));
        }
        sleep(p.phase);
    });
    logs.extend(cluster.live().map(Server::log));
    report("cluster", &sh, started, &logs)
}

/// Slots moving between primaries and a primary killed, under load, with SYNC 1: I1-I5 hold.
#[test]
fn cluster_with_slot_migrations_and_a_killed_primary() {
    cluster_chaos().finish(&[1, 2, 3, 4, 5]);
}
