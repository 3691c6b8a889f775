#!lua flags=no-writes,allow-stale
-- The lock module's INFO fields for Prometheus' redis_exporter, given to it as
--   redis_exporter -script lock.lua        (or REDIS_EXPORTER_SCRIPT=lock.lua)
-- The exporter runs it with EVAL on every scrape and turns each returned pair into
--   redis_script_values{key="lock_held"} 1
-- (1.46 and later add a filename="..." label). recording.yml renames those series.
--
-- Read-only (the no-writes flag; EVAL_RO runs it too) and allowed on a replica that lost its
-- primary (allow-stale: it only calls INFO, which such a replica answers). The shebang needs
-- Redis 7.0 or Valkey 7.2 and later.
--
-- The exporter parses every value as a float and fails the whole scrape (redis_up 0) on the
-- first one it cannot parse, so only numeric fields are returned. lock_version, a string,
-- becomes the key "lock_version=<version>" with the value 1 (recording.yml: lock_build_info),
-- and lock_policy_digest the key "lock_policy_digest=<digest>" (lock_policy_info); other
-- strings (lock_oldest_hold_tag, lock_oldest_wait_tag) are left out. A namespace's line,
--   lock_namespace_orders:held=2,waiters=0,...,refused_max_ttl=1
-- becomes one key per field, "lock_namespace_<field>/<namespace>" (recording.yml: the
-- lock_namespace_* series with a namespace label). Without the module INFO lock is empty and so
-- is the reply: no lock_* series, nothing fails.
local result = {}
local info = redis.call('INFO', 'lock')
for name, value in string.gmatch(info, '(lock_[%w_%-]+):([^\r\n]*)') do
    local namespace = string.match(name, '^lock_namespace_(.+)$')
    if namespace then
        for field, number in string.gmatch(value, '([%w_]+)=(%-?%d+)') do
            table.insert(result, 'lock_namespace_' .. field .. '/' .. namespace)
            table.insert(result, number)
        end
    elseif string.match(value, '^%-?%d+$') or string.match(value, '^%-?%d+%.%d+$') then
        table.insert(result, name)
        table.insert(result, value)
    elseif name == 'lock_version' or (name == 'lock_policy_digest' and value ~= '') then
        table.insert(result, name .. '=' .. value)
        table.insert(result, '1')
    end
end
return result
