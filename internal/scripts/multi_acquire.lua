-- multi_acquire: take every member of a MultiLock at once, when all its names share a hash
-- slot (on a single Redis, always) and every member is free with nobody queued for it. It is
-- only a faster way through what acquire does member by member: whenever a member needs more
-- than "free, take it" it writes nothing and sends the caller to acquire.
--
-- KEYS, per member in name order, 4 keys each: lock hash, fence, queue, op log (as for
--      acquire)
-- ARGV[1] owner id
-- ARGV[2] lease TTL in ms
-- ARGV[2 + i] hold id of member i
-- ARGV[3 + n] op log TTL in ms (how long a fence key outlives its value: see reserve_block)
--
-- Returns {1, token_1, ..., token_n} when the caller now holds every member, each a fresh
-- hold with a token block of its own, or when a retry of this call finds every member held
-- by it already (go-redis resends a script whose reply was lost); {0, i, pttl} when member i
-- (1-based) is a lock another owner holds, and nothing was written; {-1} when a member is free
-- but has a queue, is held by the caller, or is not a current mutex lock hash (another layout
-- or kind, another type), and nothing was written: the caller takes the members one by one
-- with acquire; {-2} when a retry finds some members held by this call and others not (they
-- expired meanwhile): the caller drops this call's holds and goes member by member. A call
-- whose reply was lost is cleaned up member by member (release.lua, which marks its hold ids
-- given up): should the call itself reach Redis only after that, it takes nothing ({-1}).
local owner, ttl = ARGV[1], ARGV[2]
local n = #KEYS / 4
for i = 1, n do
  if redis.call('HEXISTS', KEYS[4 * i], 'u:' .. ARGV[2 + i]) == 1 then
    return {-1}
  end
end
local tokens, mine = {1}, 0
local verdict -- the answer for the first member that is not free, if any
for i = 1, n do
  local k_lock = KEYS[4 * i - 3]
  if redis.call('EXISTS', k_lock) == 1 then
    local f, ok = lock_fields(k_lock, owner, '#v', '#k', '#' .. ARGV[2 + i], '#t')
    if ok and f[4] then
      mine = mine + 1 -- this very call took it: a resend
      tokens[i + 1] = tonumber(f[5])
    elseif verdict then
      -- Already answered by an earlier member; still looking for this call's marks.
    elseif not ok or f[1] or f[2] ~= LAYOUT or f[3] then
      verdict = {-1}
    else
      verdict = {0, i, redis.call('PTTL', k_lock)}
    end
  elseif not verdict then
    if redis.call('EXISTS', KEYS[4 * i - 1]) == 1 then
      verdict = {-1}
    else
      -- The fence is read before anything is written: a key of another type stops us here.
      local v = redis.pcall('GET', KEYS[4 * i - 2])
      if type(v) == 'table' and v.err then
        verdict = {-1}
      end
    end
  end
end
if mine == n then
  return tokens
elseif mine > 0 then
  return {-2}
elseif verdict then
  return verdict
end
for i = 1, n do
  local token = reserve_block(KEYS[4 * i - 2], ARGV[3 + n])
  hold_lock(KEYS[4 * i - 3], owner, '#' .. ARGV[2 + i], token, ttl, '')
  tokens[i + 1] = token
end
return tokens
