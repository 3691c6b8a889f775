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
-- becomes the key "lock_version=<version>" with the value 1 (recording.yml: lock_build_info);
-- other strings (lock_oldest_hold_tag, lock_oldest_wait_tag) are left out. Without the module
-- INFO lock is empty and so is the reply: no lock_* series, nothing fails.
local result = {}
local info = redis.call('INFO', 'lock')
for name, value in string.gmatch(info, '(lock_[%w_]+):([^\r\n]*)') do
    if string.match(value, '^%-?%d+$') or string.match(value, '^%-?%d+%.%d+$') then
        table.insert(result, name)
        table.insert(result, value)
    elseif name == 'lock_version' then
        table.insert(result, 'lock_version=' .. value)
        table.insert(result, '1')
    end
end
return result
