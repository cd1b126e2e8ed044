"""The Redis session store's Lua scripts: each change of a user's sessions is one atomic step.

Every key a script touches carries the user's hash tag (declared ones in KEYS, the rest
built from the `base` argument), so the scripts run on a Cluster too. Times come from
Redis `TIME`, so servers whose clocks differ agree.
"""

from __future__ import annotations


def fingerprint_rule_args(identity_fps: list[str], password_fps: list[str] | None) -> list[str | int]:
    """The arguments of _FINGERPRINT_RULE (the scripts' ARGV from its `at`)."""
    return [len(identity_fps), *identity_fps, *(["0"] if password_fps is None else ["1", *password_fps])]


# Shared helpers, prepended to the scripts that need them.
_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Mark one session ended and keep it as a tombstone for keep_ms (never past its expiry).
local function end_session(key, now, keep_ms)
  if redis.call('EXISTS', key) == 0 or redis.call('HEXISTS', key, 'ended_ts') == 1 then return 0 end
  redis.call('HSET', key, 'ended_ts', now)
  local ttl = redis.call('PTTL', key)
  if ttl < 0 or ttl > keep_ms then redis.call('PEXPIRE', key, math.max(keep_ms, 1)) end
  return 1
end
-- The open sessions of a device, dropping digests whose session expired or ended.
local function live(base, device)
  local set = base .. 'd:' .. device
  local out = {}
  for _, digest in ipairs(redis.call('SMEMBERS', set)) do
    local key = base .. 's:' .. digest
    if redis.call('EXISTS', key) == 1 and redis.call('HEXISTS', key, 'ended_ts') == 0 then
      table.insert(out, key)
    else
      redis.call('SREM', set, digest)
    end
  end
  return out
end
"""

# The credential-fingerprint rule, written once for Redis (as for SQLite: sqlite/store.py's
# kept_by_fingerprints), for END_STALE (ends what it does not keep) and REFINGERPRINT (counts
# and carries what it keeps). Its arguments from ARGV[at]: n, n identity digests, "1" if
# password digests follow (else "0": password changes let pass), those. kept(key): nil for a
# session without fingerprints (opened before they were kept: it stays), else whether its
# identity digest is one of those and (when passwords are compared) its password digest is
# absent or one of those (one digest per signing key).
_FINGERPRINT_RULE = """
local function fingerprint_rule(at)
  local n = tonumber(ARGV[at])
  local identities, passwords = {}, {}
  for i = at + 1, at + n do identities[ARGV[i]] = true end
  local check_password = ARGV[at + n + 1] == '1'
  for i = at + n + 2, #ARGV do passwords[ARGV[i]] = true end
  return function(key)
    local fp = redis.call('HMGET', key, 'identity_fp', 'password_fp')
    if not fp[1] then return nil end
    return identities[fp[1]] == true and (not check_password or not fp[2] or passwords[fp[2]] == true)
  end
end
"""

# KEYS: session, device set, devices hash. ARGV: user, device, created, ip, seen, expires
# ("" for none), display name, digest, identity fingerprint, password fingerprint, second factor
# ("" for none).
OPEN = """
local expires = ARGV[6]
-- Before any write: -2 for a new key, -1 for one without expiry, else its expiry.
local before = {redis.call('PEXPIRETIME', KEYS[2]), redis.call('PEXPIRETIME', KEYS[3])}
redis.call('HSET', KEYS[1], 'user', ARGV[1], 'device_id', ARGV[2], 'created_ts', ARGV[3],
           'last_seen_ip', ARGV[4], 'last_seen_ts', ARGV[5])
redis.call('SADD', KEYS[2], ARGV[8])
redis.call('HSETNX', KEYS[3], ARGV[2], ARGV[7])
if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'identity_fp', ARGV[9]) end
if ARGV[10] ~= '' then redis.call('HSET', KEYS[1], 'password_fp', ARGV[10]) end
if ARGV[11] ~= '' then redis.call('HSET', KEYS[1], 'second_factor', ARGV[11]) end
if expires ~= '' then
  redis.call('HSET', KEYS[1], 'expires_ts', expires)
  redis.call('PEXPIREAT', KEYS[1], expires)
  -- The device's keys live as long as its longest-lived session.
  for i = 2, 3 do
    local at = before[i - 1]
    if at ~= -1 and at < tonumber(expires) then redis.call('PEXPIREAT', KEYS[i], expires) end
  end
else
  redis.call('PERSIST', KEYS[2])
  redis.call('PERSIST', KEYS[3])
end
return 1
"""

# KEYS: session. ARGV: ip, ts.
TOUCH = """
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('HEXISTS', KEYS[1], 'ended_ts') == 0 then
  redis.call('HSET', KEYS[1], 'last_seen_ip', ARGV[1], 'last_seen_ts', ARGV[2])
end
return 1
"""

# KEYS: session. ARGV: user, keep_ms, base.
END = _COMMON + """
if redis.call('HGET', KEYS[1], 'user') ~= ARGV[1] then return 0 end
local device = redis.call('HGET', KEYS[1], 'device_id')
if end_session(KEYS[1], now_ms(), tonumber(ARGV[2])) == 0 then return 0 end
if #live(ARGV[3], device) == 0 then
  redis.call('DEL', ARGV[3] .. 'd:' .. device)
  redis.call('HDEL', ARGV[3] .. 'devices', device)
end
return 1
"""

# KEYS: devices hash. ARGV: keep_ms, base, "1" for every device, then device ids.
END_DEVICES = _COMMON + """
local keep, base, now = tonumber(ARGV[1]), ARGV[2], now_ms()
local devices = {}
if ARGV[3] == '1' then
  devices = redis.call('HKEYS', KEYS[1])
  -- Devices whose name was never stored still have sets: none here, HSETNX runs on open.
else
  for i = 4, #ARGV do table.insert(devices, ARGV[i]) end
end
local count = 0
for _, device in ipairs(devices) do
  for _, key in ipairs(live(base, device)) do
    count = count + end_session(key, now, keep)
  end
  redis.call('DEL', base .. 'd:' .. device)
  redis.call('HDEL', KEYS[1], device)
end
return count
"""

# KEYS: devices hash. ARGV: keep_ms, base, then the rule's (_FINGERPRINT_RULE). End the open
# sessions with fingerprints the rule does not keep; returns the device id of each one ended.
END_STALE = _COMMON + _FINGERPRINT_RULE + """
local keep, base, now = tonumber(ARGV[1]), ARGV[2], now_ms()
local kept = fingerprint_rule(3)
local ended = {}
for _, device in ipairs(redis.call('HKEYS', KEYS[1])) do
  local hit = false
  for _, key in ipairs(live(base, device)) do
    if kept(key) == false then
      if end_session(key, now, keep) == 1 then
        hit = true
        table.insert(ended, device)
      end
    end
  end
  if hit and #live(base, device) == 0 then
    redis.call('DEL', base .. 'd:' .. device)
    redis.call('HDEL', KEYS[1], device)
  end
end
return ended
"""

# KEYS: devices hash. ARGV: base, new identity fingerprint ("" to count only), new password
# fingerprint, then the rule's (_FINGERPRINT_RULE). Returns how many open sessions the rule
# keeps (and gives them the new fingerprints).
REFINGERPRINT = _COMMON + _FINGERPRINT_RULE + """
local base, new_identity, new_password = ARGV[1], ARGV[2], ARGV[3]
local kept = fingerprint_rule(4)
local count = 0
for _, device in ipairs(redis.call('HKEYS', KEYS[1])) do
  for _, key in ipairs(live(base, device)) do
    if kept(key) then
      count = count + 1
      if new_identity ~= '' then redis.call('HSET', key, 'identity_fp', new_identity, 'password_fp', new_password) end
    end
  end
end
return count
"""

# KEYS: devices hash. ARGV: base, one device id or "" for all.
# Returns device, name, last ip, last ts for each device with an open session.
DEVICES = _COMMON + """
local base = ARGV[1]
local devices = {}
if ARGV[2] ~= '' then devices = {ARGV[2]} else devices = redis.call('HKEYS', KEYS[1]) end
local out = {}
for _, device in ipairs(devices) do
  local keys = live(base, device)
  if #keys == 0 then
    redis.call('HDEL', KEYS[1], device)
  else
    local best_ip, best_ts, best_factor = '', -1, ''
    for _, key in ipairs(keys) do
      local seen = redis.call('HMGET', key, 'last_seen_ip', 'last_seen_ts', 'second_factor')
      local ts = tonumber(seen[2]) or 0
      if ts > best_ts then best_ip, best_ts, best_factor = seen[1], ts, seen[3] or '' end
    end
    local name = redis.call('HGET', KEYS[1], device) or ''
    table.insert(out, device)
    table.insert(out, name)
    table.insert(out, best_ip)
    table.insert(out, tostring(best_ts))
    table.insert(out, best_factor)
  end
end
return out
"""

# KEYS: devices hash. ARGV: base, device, name. 1 if renamed, 0 if no such device.
RENAME = _COMMON + """
if #live(ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return 1
"""
