#!/usr/bin/env bash
# Instruction profile of one command on the server side: redis-server with the release module
# runs under valgrind --tool=callgrind, instrumentation is switched on only while redis-benchmark
# sends the command (after any preload), and the result is summarised as instructions per
# request plus the functions with the largest inclusive and exclusive shares. Counts
# instructions, not time, so it is repeatable on a noisy machine.
#
#   bench/profile.sh acquire            # LOCK.ACQUIRE on fresh keys
#   bench/profile.sh set                # its baseline, SET NX PX on fresh keys
#   bench/profile.sh release | release-lua | renew | renew-lua | fence | get
#   bench/profile.sh expire             # REQUESTS leases running out together, with
#                                       # notify-keyspace-events Ed and a subscriber
#
# NAMESPACES="..." runs it under that lock.namespaces policy.
# REQUESTS (default 20000) and PIPELINE (default 16) size the run; CACHE_SIM=1 also simulates
# the caches (D1/LL misses per function: where time goes beyond instruction counts). The full
# callgrind output stays in target/bench/profile/<row>.callgrind for callgrind_annotate.
set -euo pipefail

row="${1:-}"
requests="${REQUESTS:-20000}"
pipeline="${PIPELINE:-16}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module="${LOCK_MODULE:-$root/target/release/libredis_lock.so}"
server_bin="${REDIS_SERVER:-redis-server}"
out_dir="$root/target/bench/profile"
token=6f1c2a9e-4b7d-4e02-9a55-3c8d0f7b21e4

release_lua="if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
renew_lua="if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
preload_locks="for i = 0, tonumber(ARGV[1]) - 1 do redis.call('LOCK.ACQUIRE', ARGV[2] .. string.format('%012d', i), ARGV[3], '600000') end return 1"
preload_expiring="for i = 0, tonumber(ARGV[1]) - 1 do redis.call('LOCK.ACQUIRE', ARGV[2] .. string.format('%012d', i), ARGV[3], '30000') end return 1"
preload_strings="for i = 0, tonumber(ARGV[1]) - 1 do redis.call('SET', ARGV[2] .. string.format('%012d', i), ARGV[3], 'PX', '600000') end return 1"

keys=$((2 * requests))
case "$row" in
    acquire) preload=; range=1000000000; cmd=(LOCK.ACQUIRE l:__rand_int__ "$token" 60000) ;;
    set) preload=; range=1000000000; cmd=(SET s:__rand_int__ "$token" NX PX 60000) ;;
    release) preload=locks; range=$keys; cmd=(LOCK.RELEASE l:__rand_int__ "$token") ;;
    release-lua) preload=strings; range=$keys; cmd=(EVALSHA @release 1 s:__rand_int__ "$token") ;;
    renew) preload=locks; range=$keys; cmd=(LOCK.RENEW l:__rand_int__ "$token" 60000) ;;
    renew-lua) preload=strings; range=$keys; cmd=(EVALSHA @renew 1 s:__rand_int__ "$token" 60000) ;;
    fence) preload=locks; range=$keys; cmd=(LOCK.FENCE l:__rand_int__ 1) ;;
    get) preload=strings; range=$keys; cmd=(GET s:__rand_int__) ;;
    expire) preload=expiring; range=0; cmd=(expire "$requests" leases) ;;
    *) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 2 ;;
esac

command -v valgrind >/dev/null || { echo "profile: valgrind not found (apt-get install valgrind)"; exit 1; }
[[ -f $module ]] || { echo "profile: $module missing: cargo build --release"; exit 1; }
mkdir -p "$out_dir"
work="$(mktemp -d)"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
trace="$out_dir/$row.callgrind"
rm -f "$trace"

cache_sim=no
[[ -n ${CACHE_SIM:-} && ${CACHE_SIM} != 0 ]] && cache_sim=yes
valgrind --tool=callgrind --instr-atstart=no --cache-sim="$cache_sim" --callgrind-out-file="$trace" \
    "$server_bin" --port "$port" --bind 127.0.0.1 --dir "$work" --save '' --appendonly no \
    --loadmodule "$module" >"$work/valgrind.log" 2>&1 &
vg=$!
cleanup() {
    kill "$vg" 2>/dev/null || true
    wait "$vg" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

cli() { redis-cli -p "$port" "$@"; }
for _ in $(seq 200); do cli ping >/dev/null 2>&1 && break; sleep 0.1; done
cli ping >/dev/null

# NAMESPACES: a lock.namespaces policy to run under (what the namespaces cost a request).
[[ -n ${NAMESPACES:-} ]] && cli config set lock.namespaces "$NAMESPACES" >/dev/null
release_sha=$(cli script load "$release_lua")
renew_sha=$(cli script load "$renew_lua")
case "$preload" in
    expiring)
        cli config set notify-keyspace-events Ed >/dev/null
        cli config set client-output-buffer-limit "pubsub 0 0 0" >/dev/null
        redis-cli -p "$port" subscribe __keyevent@0__:lock.expired >/dev/null &
        # Loading under valgrind is slow: the leases end 30 s after they are taken.
        cli eval "$preload_expiring" 0 "$requests" x: "$token" >/dev/null ;;
    locks) cli eval "$preload_locks" 0 "$keys" l: "$token" >/dev/null ;;
    strings) cli eval "$preload_strings" 0 "$keys" s: "$token" >/dev/null ;;
esac
for i in "${!cmd[@]}"; do
    [[ ${cmd[$i]} == @release ]] && cmd[$i]=$release_sha
    [[ ${cmd[$i]} == @renew ]] && cmd[$i]=$renew_sha
done

callgrind_control -i on "$vg" >/dev/null
if [[ $row == expire ]]; then
    # Instrumented from now until nothing is held any more.
    for _ in $(seq 1200); do
        held=$(cli info lock | tr -d '\r' | sed -n 's/^lock_held://p')
        [[ $held == 0 ]] && break
        sleep 0.1
    done
    echo "expired: $(cli info lock | tr -d '\r' | sed -n 's/^lock_expired://p')"
else
    redis-benchmark -p "$port" -c 50 -n "$requests" -P "$pipeline" -r "$range" -q "${cmd[@]}" \
        | tr '\r' '\n' | tail -1
fi
callgrind_control -i off "$vg" >/dev/null
cli shutdown nosave >/dev/null 2>&1 || true
wait "$vg" 2>/dev/null || true
trap - EXIT
rm -rf "$work"

total=$(callgrind_annotate "$trace" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }')
echo
echo "== $row: ${cmd[*]}"
echo "== $requests requests, pipeline $pipeline: $total instructions, $((total / requests)) per request"
echo
echo "-- inclusive (top 40)"
callgrind_annotate --inclusive=yes "$trace" 2>/dev/null | sed -n '/file:function/,$p' | sed -n '3,42p'
echo
echo "-- exclusive (top 25)"
callgrind_annotate "$trace" 2>/dev/null | sed -n '/file:function/,$p' | sed -n '3,27p'
echo
echo "(full output: callgrind_annotate [--inclusive=yes] [--tree=caller] $trace)"
