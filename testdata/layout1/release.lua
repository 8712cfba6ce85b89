-- release: drop one hold of a reentrant lock; at zero hand the lock to the first live waiter
-- (direct grant: no herd, first come first served) or delete it.
--
-- KEYS[1] lock hash   {owner: holdCount, "#"..holdId: 1 per hold}
-- KEYS[2] op log      hash (see acquire.lua)
-- KEYS[3] fence
-- KEYS[4] queue       sorted set of waiting owners scored by when they joined (ms)
-- KEYS[5] liveness    hash {waiting owner: deadline in ms of server time}
-- ARGV[1] owner id
-- ARGV[2] hold id of the hold being released (the id its acquire used)
-- ARGV[3] op log TTL in ms
-- ARGV[4] notification channel
-- ARGV[5] "1" to release only if the hold exists, never reporting it as already released: the
--         clean-up after an acquire whose reply was lost
-- ARGV[6] grace in ms: TTL of a lock granted to a waiter until it confirms
-- ARGV[7] PUBLISH or SPUBLISH
-- ARGV[8] "1" for a waiter giving up: leave the queue, and pass on a lock granted to it
-- ARGV[9] barging window in ms: a first waiter that has waited less is not granted the lock
--         but woken ("w <owner>") to compete for it with callers outside the queue
--
-- Returns 3 when the lock was handed to a waiter ("g <owner>" published), 2 when it was
-- freed ("w <owner>" published when a waiter is first in line), 1 when one of several holds was dropped or this release had already
-- been applied (a retry after a lost reply), 0 when the hold does not exist (expired, deleted,
-- taken) and was not released by this call's earlier attempt.
local owner, mark = ARGV[1], '#' .. ARGV[2]

-- hand_on frees the lock: to the first live waiter if any. log is the op log field the
-- caller records with it ('r:'..owner for a release, nil when a waiter gives up).
local function hand_on(log)
  redis.call('DEL', KEYS[1])
  local head, waited = first_waiter(KEYS[4], KEYS[5])
  if head and waited >= tonumber(ARGV[9]) then
    leave_queue(KEYS[4], KEYS[5], head)
    local token = grant(KEYS[1], KEYS[3], head, ARGV[6], ARGV[4], ARGV[7])
    if log then
      redis.call('HSET', KEYS[2], log, ARGV[2], 'g:' .. head, token)
    else
      redis.call('HSET', KEYS[2], 'g:' .. head, token)
    end
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
    return 3
  end
  if log then
    redis.call('HSET', KEYS[2], log, ARGV[2])
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
  end
  -- Every waiter is in the queue (its attempts join it), so with nobody there, nobody is told.
  if head then
    redis.call(ARGV[7], ARGV[4], 'w ' .. head)
  end
  return 2
end

if ARGV[8] == '1' then
  leave_queue(KEYS[4], KEYS[5], owner)
  -- A lock granted to us and not yet confirmed is ours to pass on; if its grace ran out the
  -- key may be someone else's by now, so check it still names us.
  local granted = redis.call('HGET', KEYS[2], 'g:' .. owner)
  if granted then
    redis.call('HDEL', KEYS[2], 'g:' .. owner)
    if redis.call('HGET', KEYS[1], owner) then
      return hand_on(nil)
    end
  end
  return 0
end

local f = redis.call('HMGET', KEYS[1], mark, owner)
if not f[1] then
  if ARGV[5] == '1' then
    return 0
  end
  -- The hold's field goes only with its release or with the whole lock: if the owner still
  -- holds, or its last freeing release was this one, the release was applied before.
  if f[2] or redis.call('HGET', KEYS[2], 'r:' .. owner) == ARGV[2] then
    return 1
  end
  return 0
end
if f[2] ~= '1' then
  redis.call('HDEL', KEYS[1], mark)
  redis.call('HINCRBY', KEYS[1], owner, -1)
  return 1
end
return hand_on('r:' .. owner)
